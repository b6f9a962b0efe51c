"""``python -m tests.support.forking SCENARIO DIR``: jetcrawl.local.services' forks, in a process
of their own.

A fork is only safe from a process with one thread and no event loop, which a pytest process
that has run other tests is not; and ``Prefork.start`` freezes the garbage collector's objects.
So tests/test_services.py runs each scenario here, in a new interpreter, and reads the JSON it
prints: facts about the forked services, observed from the process that forked them.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
from pathlib import Path

import orjson

from jetcrawl.cli import main
from jetcrawl.local.services import Launch, Prefork, fork_safe
from tests.support.procfs import running, stat


def forked(prefork: Prefork) -> list[int]:
    return [slot.process.pid or 0 for slot in prefork._slots]


async def launched(prefork: Prefork, launches: list[Launch]) -> list[int]:
    services = [prefork.launch(launch) for launch in launches]
    return [await service.wait() for service in services]


def scenario_launch(workdir: Path) -> dict[str, object]:
    """Two services told to run ``jetcrawl topology``: each with its own environment and log."""
    prefork = Prefork.start(["dispatcher", "worker"], main)
    assert prefork is not None
    pids = forked(prefork)
    names = [found.name for pid in pids if (found := stat(pid)) is not None]
    base = {k: v for k, v in os.environ.items() if not k.startswith("JETCRAWL_")}
    launches = [
        Launch("dispatcher", ("topology",), {**base, "JETCRAWL_SHARDS": "3"}, workdir / "d.log"),
        Launch("worker", ("topology",), {**base, "JETCRAWL_SHARDS": "5"}, workdir / "w.log"),
    ]
    with prefork:
        codes = asyncio.run(launched(prefork, launches))
    return {
        "names": names,
        "codes": codes,
        "logs": [launch.log_path.read_text() for launch in launches],
        "alive": [running(pid) for pid in pids],
        "parent_env_kept": "JETCRAWL_SHARDS" not in os.environ,
    }


def scenario_exit_codes(workdir: Path) -> dict[str, object]:
    """A bad setting (exit 2), and one killed while it runs (-9)."""
    prefork = Prefork.start(["worker", "worker"], main)
    assert prefork is not None
    bad = {**os.environ, "JETCRAWL_NO_SUCH_SETTING": "1"}
    # A NATS "server" that accepts and never answers: the second worker waits on it.
    silent = socket.create_server(("127.0.0.1", 0))
    stuck = {**os.environ, "JETCRAWL_NATS_URL": f"nats://127.0.0.1:{silent.getsockname()[1]}"}

    async def run() -> list[int]:
        first = prefork.launch(Launch("worker", ("worker",), bad, workdir / "bad.log"))
        second = prefork.launch(Launch("worker", ("worker",), stuck, workdir / "stuck.log"))
        code = await first.wait()
        second.kill()
        waits = await asyncio.gather(second.wait(), second.wait())  # two waiters, one exit
        second.kill()  # reaped: a no-op, not a signal to a pid that may be another's now
        return [code, *waits, second.returncode or 0]

    with prefork, silent:
        codes = asyncio.run(run())
    return {"codes": codes, "bad_log": (workdir / "bad.log").read_text()}


def scenario_unused(workdir: Path) -> dict[str, object]:
    """Slots never launched end when the Prefork closes; a second close is a no-op."""
    prefork = Prefork.start(["dispatcher", "worker", "worker"], main)
    assert prefork is not None
    pids = forked(prefork)
    before = [running(pid) for pid in pids]
    with prefork:
        pass
    prefork.close()
    try:
        prefork.launch(Launch("worker", ("topology",), dict(os.environ), workdir / "late.log"))
    except LookupError as e:
        late = str(e)
    else:
        late = ""
    return {
        "before": before,
        "after": [running(pid) for pid in pids],
        "codes": [slot.process.exitcode for slot in prefork._slots],
        "late": late,
    }


def scenario_unsafe(workdir: Path) -> dict[str, object]:
    """With a second thread running there is no fork: the caller spawns instead."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        return {"fork_safe": fork_safe(), "prefork": Prefork.start(["worker"], main) is not None}
    finally:
        stop.set()
        thread.join()


def scenario_in_a_loop(workdir: Path) -> dict[str, object]:
    """Nor from inside a running event loop (a forked child would inherit it as running)."""

    async def inside() -> dict[str, object]:
        return {"fork_safe": fork_safe(), "prefork": Prefork.start(["worker"], main) is not None}

    return asyncio.run(inside())


SCENARIOS = {
    "launch": scenario_launch,
    "exit_codes": scenario_exit_codes,
    "unused": scenario_unused,
    "unsafe": scenario_unsafe,
    "in_a_loop": scenario_in_a_loop,
}

if __name__ == "__main__":
    facts = SCENARIOS[sys.argv[1]](Path(sys.argv[2]))
    sys.stdout.buffer.write(orjson.dumps(facts))
