"""Sinks plug in through the entry-point group ``jetcrawl.sinks``: jetcrawl's own two, and a
third party's installed beside them (a distribution made in a temp dir, on PYTHONPATH)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nats.js import JetStreamContext

from jetcrawl.contract.topology import ITEMS_STREAM
from jetcrawl.local.embedded import NatsServer
from jetcrawl.sinks import SINK_API_VERSION, SinkPlugin
from jetcrawl.sinks.plugins import find_sinks
from tests.support.sinks import SinkProcess, items_stream, make_item, publish_items, wait_settled

# A third party's sink: every record's message appended to --to FILE, durable at once.
PLUGIN_MODULE = """
import os
from jetcrawl.sinks import ITEMS, SINK_API_VERSION, SinkPlugin


class LineSink:
    def __init__(self, path):
        self.path = path

    def describe(self):
        return f"lines in {self.path}"

    async def open(self):
        pass

    async def write(self, records):
        with open(self.path, "ab") as f:
            for r in records:
                f.write(r.raw + b"\\n")
            f.flush()
            os.fsync(f.fileno())
        return records

    async def flush(self):
        return ()

    async def close(self):
        pass


def add_arguments(p):
    p.add_argument("--to", required=True)


PLUGIN = SinkPlugin(
    api_version=SINK_API_VERSION,
    summary="append messages to a file",
    kinds=frozenset({ITEMS}),
    add_arguments=add_arguments,
    create=lambda args, settings: LineSink(args.to),
)
OLD = SinkPlugin(
    api_version=99,
    summary="from the future",
    kinds=frozenset({ITEMS}),
    add_arguments=add_arguments,
    create=lambda args, settings: LineSink(args.to),
)
"""


def third_party(root: Path) -> dict[str, str]:
    """Install the plugin as a distribution in ``root``; the environment that finds it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "linesink.py").write_text(PLUGIN_MODULE)
    info = root / "linesink-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: linesink\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[jetcrawl.sinks]\n"
        "lines = linesink:PLUGIN\n"
        "future = linesink:OLD\n"
        "broken = linesink_missing:PLUGIN\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}


def jetcrawl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jetcrawl", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_jetcrawls_own_sinks_come_through_the_entry_points() -> None:
    found = find_sinks()
    for name in ("postgres", "files"):
        plugin = found[name]
        assert isinstance(plugin, SinkPlugin) and plugin.api_version == SINK_API_VERSION


def test_a_third_party_sink_is_listed_and_an_unusable_one_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    env = third_party(tmp_path)
    listed = jetcrawl("sink", "--help", env=env)
    assert listed.returncode == 0, listed.stderr
    for name in ("lines", "postgres", "files", "future", "broken"):
        assert name in listed.stdout
    assert "append messages to a file" in listed.stdout

    for name, problem in [
        ("future", "was written for sink API version 99; this jetcrawl has version 1"),
        ("broken", "cannot be loaded: ModuleNotFoundError"),
    ]:
        refused = jetcrawl("sink", name, env=env)
        assert refused.returncode == 2
        assert problem in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    # The other commands do not suffer from a broken plugin.
    assert jetcrawl("topology", "--shards", "2", env=env).returncode == 0


async def test_a_third_party_sink_stores_items_as_the_service_drives_it(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    env = third_party(tmp_path / "site")
    out = tmp_path / "lines.jsonl"
    await items_stream(js)
    await publish_items(js, [make_item(n) for n in range(10)])
    await publish_items(js, [make_item(n, job="other") for n in range(4)])
    sink = SinkProcess(
        ["lines", "--to", str(out), "--job", "shop", "--nats", nats_server.url],
        env,
        tmp_path / "sink.log",
    )
    await sink.start()
    try:
        await wait_settled(js, ITEMS_STREAM, "sink-lines-shop")
    finally:
        assert await sink.stop() == 0, sink.output()
    assert len(out.read_bytes().splitlines()) == 10
