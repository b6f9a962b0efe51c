"""Commands fail fast: a dead NATS or etcd, a bad seed or output path, an unknown setting each
cost one line naming the cause and exit status 2, before anything is started (issue 24)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from jetcrawl.cli import build_parser
from jetcrawl.cli.runtime import STOP_GRACE_S
from jetcrawl.cli.settings import settings_from
from jetcrawl.contract.errors import SettingsError
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import RESULTS_STREAM
from jetcrawl.local.embedded import NatsServer, free_ports
from jetcrawl.plumbing.topology import ensure
from tests.support.badsite import RawServer
from tests.support.streams import eventually

GIVE_UP_S = "2"


@contextlib.asynccontextmanager
async def running(argv: Sequence[str]) -> AsyncIterator[asyncio.subprocess.Process]:
    """``jetcrawl ARGV`` (stderr piped), killed on the way out if it still runs."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "jetcrawl", *argv),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("JETCRAWL_")},
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def jetcrawl(*argv: str, within_s: float = 60) -> tuple[int, list[str]]:
    """Run ``jetcrawl ARGV``; its exit status and its standard error lines."""
    async with running(argv) as proc, asyncio.timeout(within_s):
        _, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, err.decode().splitlines()


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["results"],
        ["dlq", "list"],
        ["topology", "--apply"],
        ["crawl", "http://a.test/"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
async def test_a_command_gives_up_on_a_dead_nats_naming_the_url_and_the_cause(
    command: list[str],
) -> None:
    [port] = free_ports(1)
    url = f"nats://127.0.0.1:{port}"
    code, err = await jetcrawl(*command, "--nats", url, "--connect-timeout", GIVE_UP_S)
    assert code == 2, err
    assert err[-1] == f"jetcrawl: cannot connect to NATS at {url}: connection refused " + (
        "(is nats-server running there?)"
    ), err
    assert not any("Traceback" in line for line in err), err


async def test_the_same_command_against_a_live_nats_succeeds(nats_server: NatsServer) -> None:
    code, err = await jetcrawl("dlq", "list", "--nats", nats_server.url)
    assert code == 0, err


async def test_status_gives_up_on_a_dead_etcd_naming_it(nats_server: NatsServer) -> None:
    [port] = free_ports(1)
    etcd = f"http://127.0.0.1:{port}"
    code, err = await jetcrawl("status", "--nats", nats_server.url, "--etcd", etcd)
    assert code == 2, err
    assert err[-1].startswith(f"jetcrawl: etcd get prefix at {etcd}: unavailable"), err


async def test_a_crawl_with_a_dead_etcd_fails_before_its_services_start(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    [port] = free_ports(1)
    etcd = f"http://127.0.0.1:{port}"
    argv = ("crawl", "http://a.test/", "--nats", nats_server.url, "--etcd", etcd)
    code, err = await jetcrawl(*argv, "--connect-timeout", GIVE_UP_S)
    assert code == 2, err
    assert err[-1].startswith(f"jetcrawl: etcd get prefix at {etcd}: unavailable"), err
    assert not any("dispatcher" in line or "worker" in line for line in err), "none started"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["not a url"], "jetcrawl: seed 'not a url': not a URL jetcrawl can crawl"),
        (["ftp://a.test/"], "jetcrawl: seed 'ftp://a.test/': not a URL jetcrawl can crawl"),
        (["http://a.test/", "--output", "/nonexistent-dir/x.jsonl"], "no such directory"),
        (["http://a.test/", "--set", "hots_delay_s=1"], "unknown setting (misspelt?)"),
        (["http://a.test/", "--set", "host_delay_s=soon"], "bad value 'soon'"),
    ],
)
async def test_bad_crawl_input_is_one_line_before_anything_starts(
    args: list[str], said: str, tmp_path: Path
) -> None:
    code, err = await jetcrawl("crawl", *args, within_s=30)
    assert code == 2
    assert len(err) == 1 and said in err[0], err


async def test_an_output_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    code, err = await jetcrawl("crawl", "http://a.test/", "--output", str(tmp_path))
    assert (code, err) == (2, [f"jetcrawl: --output {tmp_path}: is a directory; name a file"])


def test_politeness_flags_and_set_reach_the_settings() -> None:
    parser = build_parser()
    argv = ["crawl", "http://a.test/", "--host-delay", "0.25", "--host-concurrency", "2"]
    argv += ["--user-agent", "acme-bot/1.0 (+https://acme.test/bot)"]
    argv += ["--set", "max_deferrals=5", "--set", "host_delay_s=9"]
    args = parser.parse_args(argv)
    settings = settings_from(args)
    assert settings.host_delay_s == 0.25, "a named flag wins over --set"
    assert settings.host_concurrency == 2
    assert settings.user_agent == "acme-bot/1.0 (+https://acme.test/bot)"
    assert settings.max_deferrals == 5
    with pytest.raises(SettingsError):
        settings_from(parser.parse_args(["worker", "--set", "max_deferral=5"]))
    assert settings_from(parser.parse_args(["dispatcher", "--set", "shards=8"])).shards == 8


async def interrupted(
    argv: list[str], sig: signal.Signals, after: Callable[[], Awaitable[None]]
) -> int:
    """Start ``jetcrawl ARGV``, send ``sig`` once ``after()`` returns; its exit status, which
    must come within the stop grace (and a margin for a loaded machine)."""
    async with running(argv) as proc:
        await after()
        assert proc.returncode is None, "still running when signalled"
        proc.send_signal(sig)
        async with asyncio.timeout(STOP_GRACE_S + 3):
            await proc.communicate()
            return await proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize(
    "command", [["status"], ["results"], ["dlq", "list"], ["topology", "--apply"]], ids=" ".join
)
async def test_a_signal_stops_a_command_that_is_still_connecting(
    command: list[str], sig: signal.Signals
) -> None:
    # A server that accepts and never says a word: the connect would wait out its timeouts.
    async with RawServer(b"", hang=True) as silent:
        url = f"nats://127.0.0.1:{silent.port}"
        argv = [*command, "--nats", url, "--connect-timeout", "60"]
        code = await interrupted(argv, sig, lambda: silent.connected.wait())
    assert code in (130, -sig), code


async def test_a_signal_stops_results_follow(nats_server: NatsServer, js: JetStreamContext) -> None:
    await ensure(js, Settings(nats_url=nats_server.url))

    async def following() -> None:  # its consumer on the results stream is there
        async def reading() -> bool:
            return (await js.stream_info(RESULTS_STREAM)).state.consumer_count > 0

        await eventually(reading)

    argv = ["results", "--follow", "--nats", nats_server.url]
    assert await interrupted(argv, signal.SIGTERM, following) == 0
