"""What a ``jetcrawl`` process loads: aiohttp only where used, the tracing SDK only when on."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from jetcrawl.local.embedded import NatsServer
from tests.support.streams import eventually

# Run in a fresh interpreter: the test process has aiohttp loaded already.
PROBE = """
import sys
from jetcrawl.cli.runtime import defer_aiohttp
defer_aiohttp()
import {modules}
loaded = type(sys.modules["aiohttp"]).__name__ == "module"
print("loaded" if loaded else "deferred")
"""


def _aiohttp_after(*modules: str) -> str:
    code = PROBE.format(modules=", ".join(modules))
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_a_dispatcher_and_the_crawl_command_do_not_load_aiohttp() -> None:
    # What run_dispatcher and run_crawl import (nats-py imports aiohttp for websockets).
    modules = (
        "jetcrawl.dispatcher",
        "jetcrawl.local.crawl",
        "jetcrawl.plumbing.health",
        "jetcrawl.plumbing.metrics",
        "jetcrawl.otel",
    )
    assert _aiohttp_after(*modules) == "deferred"


def test_aiohttp_loads_where_it_is_used() -> None:
    assert _aiohttp_after("worker") == "loaded"
    assert _aiohttp_after("jetcrawl.plumbing.endpoint") == "loaded"


SDK_PROBE = """
import os, sys
for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
    os.environ.pop(name, None)
if {endpoint!r}:
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = {endpoint!r}
import jetcrawl.dispatcher, worker
from jetcrawl.otel import setup_tracing
tracing = setup_tracing("probe", "probe-1", "0")
sdk = any(name.startswith("opentelemetry.sdk") for name in sys.modules)
print(tracing.enabled, sdk)
tracing.shutdown()
"""


def _sdk_probe(endpoint: str) -> list[str]:
    code = SDK_PROBE.format(endpoint=endpoint)
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()


def test_the_tracing_sdk_loads_only_when_tracing_is_on() -> None:
    assert _sdk_probe("") == ["False", "False"]
    # An endpoint nobody listens on: nothing is exported, the setup only has to work.
    assert _sdk_probe("http://127.0.0.1:9") == ["True", "True"]


def test_a_deferred_aiohttp_works_when_used() -> None:
    code = PROBE.format(modules="nats") + (
        "import aiohttp\nfrom aiohttp import web\n"
        "assert aiohttp.ClientSession and web.Application\nprint('used')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert out == ["deferred", "used"]


async def test_a_running_dispatcher_has_not_loaded_aiohttp(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Its code: aiohttp's C extensions are not mapped into the process (they would be, loaded)."""
    log_path = tmp_path / "dispatcher.log"
    env = {**os.environ, "JETCRAWL_NATS_URL": nats_server.url}
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "jetcrawl", "dispatcher", env=env, stdout=log, stderr=log
        )
    try:

        async def running() -> bool:
            return b"dispatcher running" in _read(log_path)

        await eventually(running)
        maps = _read(Path(f"/proc/{proc.pid}/maps")).decode()
        assert "orjson" in maps  # a C extension it loaded is mapped
        assert "aiohttp" not in maps
    finally:
        proc.terminate()
        await proc.wait()


def _read(path: Path) -> bytes:
    return path.read_bytes()
