"""``jetcrawl crawl``'s last lines and exit status tell the truth: what gave no page and why,
with the fix where a flag is one; a crawl that fetched nothing exits 1 (issue 24)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import sys
from pathlib import Path

import pytest

from jetcrawl.contract.messages import Result
from jetcrawl.local.summary import fix_for
from tests.support.badsite import BadSite
from tests.support.streams import eventually


async def crawl(tmp_path: Path, *argv: str) -> tuple[int, list[str], list[str]]:
    """``jetcrawl crawl ARGV`` with one worker: its exit status, stdout and stderr lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JETCRAWL_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "jetcrawl", "crawl", *argv, "--workers", "1"),
        *("--output", str(tmp_path / "out.jsonl"), "--set", "shards=2"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**env, "TMPDIR": str(tmp_path)},
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode().splitlines(), err.decode().splitlines()


async def test_a_loopback_seed_without_allow_net_exits_1_and_names_the_flag(
    tmp_path: Path,
) -> None:
    async with BadSite(host="127.0.0.2") as site:
        site.add("/", "<title>home</title>")
        code, out, err = await crawl(tmp_path, site.url("/"))
    port = site.url("/").split(":")[2].rstrip("/")
    cause = (
        f"blocked 1: {site.url('/')}: SSRF guard refused 127.0.0.2:{port} (loopback) "
        "(127.0.0.2 is loopback: pass --allow-net 127.0.0.0/8)"
    )
    assert code == 1, (out, err)
    assert out[1:3] == ["no page from:", f"  {cause}"], out
    assert err[-1] == f"jetcrawl: no page was fetched: {cause}"


async def test_with_allow_net_the_same_crawl_fetches_and_exits_0(tmp_path: Path) -> None:
    async with BadSite(host="127.0.0.2") as site:
        site.add("/", "<title>home</title><a href='/gone'>gone</a>")
        site.add("/gone", "not here", status=404)
        code, out, err = await crawl(tmp_path, site.url("/"), "--allow-net", "127.0.0.0/8")
    assert code == 0, (out, err)
    assert "URLs without a page, by cause:" in out
    assert f"  http_404 1: {site.url('/gone')}: the server answered HTTP 404" in out
    assert not any(line.startswith("jetcrawl: no page") for line in err)


@pytest.mark.parametrize(
    ("message", "fix"),
    [
        (
            "SSRF guard refused 10.1.2.3:80 (private)",
            "10.1.2.3 is private: pass --allow-net 10.0.0.0/8",
        ),
        (
            "SSRF guard refused 192.168.7.1:8080 (private)",
            "192.168.7.1 is private: pass --allow-net 192.168.0.0/16",
        ),
        (
            "SSRF guard refused [fd00::1]:443 (private)",
            "fd00::1 is private: pass --allow-net fc00::/7",
        ),
        (
            "SSRF guard refused 127.0.0.1:4222 (mesh_endpoint)",
            "that is the mesh's own NATS or etcd: never crawled",
        ),
        (
            "SSRF guard refused its address",
            "pass --allow-net CIDR to let the crawl reach that network",
        ),
    ],
)
def test_the_fix_for_a_refused_address_names_its_network(message: str, fix: str) -> None:
    assert fix_for("blocked", message) == fix
    assert fix_for("dns", message) is None, "only the guard has a flag to fix it"


async def test_records_reach_the_output_file_while_the_crawl_runs(tmp_path: Path) -> None:
    # One page a second (Crawl-delay 1): the first records must be in the file long before
    # the last page is fetched, not only when the file is closed at the end.
    output = tmp_path / "out.jsonl"
    async with BadSite(host="127.0.0.2") as site:
        site.add("/", "<title>home</title>" + "".join(f"<a href='/p{n}'>p</a>" for n in range(4)))
        for n in range(4):
            site.add(f"/p{n}", f"<title>p{n}</title>")
        site.add("/robots.txt", "User-agent: *\nCrawl-delay: 1\n", content_type="text/plain")
        running = asyncio.create_task(crawl(tmp_path, site.url("/"), "--allow-net", "127.0.0.0/8"))

        def written() -> int:
            return len(output.read_bytes().splitlines()) if output.exists() else 0

        async def two_lines_or_done() -> bool:  # a file has no event to wait on
            return written() >= 2 or running.done()

        await eventually(two_lines_or_done, within_s=60)
        seen_while_running = (written(), len(site.log), running.done())
        code, out, err = await running
    assert code == 0, (out, err)
    lines, requests, finished = seen_while_running
    assert not finished and lines >= 2, seen_while_running
    assert requests < 1 + 1 + 4, "read before the last page was fetched"


@pytest.mark.parametrize(("budget", "attempts"), [([], 3), (["--set", "retry_budget_s=1.5"], 2)])
async def test_a_dripping_server_costs_the_urls_budget_and_the_tail_says_so(
    tmp_path: Path, budget: list[str], attempts: int
) -> None:
    # /drip.html sends a byte every 50 ms for ever: each attempt is cut at total_timeout_s.
    # By default a URL has 3 attempts; a time budget of 1.5 s leaves it 2.
    async with BadSite(host="127.0.0.2") as site:
        site.add("/", "<title>home</title><a href='/drip.html'>drip</a>")
        code, out, err = await crawl(
            tmp_path,
            site.url("/"),
            *("--allow-net", "127.0.0.0/8", "--set", "total_timeout_s=1"),
            *("--set", "retry_base_delay_s=0.1", "--set", "progress_log_every_s=0.3"),
            *("--set", "report_interval_s=0.2"),
            *budget,
        )
        drips = [path for _, path in site.log if path == "/drip.html"]
    assert code == 0, (out, err)
    [record] = [
        r
        for r in map(Result.from_wire, (tmp_path / "out.jsonl").read_bytes().splitlines())
        if r.url == site.url("/drip.html")
    ]
    assert (record.outcome, record.attempt, len(drips)) == ("failed", attempts, attempts)
    assert record.error is not None and record.error.kind == "timeout"
    assert f"  {site.url('/drip.html')}  fetching for" in "\n".join(err), "the tail said why"


async def test_a_name_that_does_not_resolve_is_said_by_its_name(tmp_path: Path) -> None:
    # robots.txt is read first: its failure says why, and the URL's budget (3 attempts) ends it.
    code, out, err = await crawl(
        tmp_path, "http://jetcrawl.invalid/", "--set", "retry_base_delay_s=0.1"
    )
    assert code == 1, (out, err)
    [cause] = [line for line in out if line.startswith("  robots_unavailable 1: ")]
    assert "http://jetcrawl.invalid/: robots.txt unavailable: dns: " in cause, cause
    assert err[-1].startswith("jetcrawl: no page was fetched: robots_unavailable 1: "), err


async def test_on_a_terminal_the_progress_is_a_live_panel(tmp_path: Path) -> None:
    reader, writer = pty.openpty()  # the crawl's stderr is a terminal
    env = {k: v for k, v in os.environ.items() if not k.startswith("JETCRAWL_")}
    async with BadSite(host="127.0.0.2") as site:
        site.add("/", "<title>home</title><a href='/a'>a</a>")
        site.add("/a", "<title>a</title>")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "jetcrawl", "crawl", site.url("/"), "--workers", "1"),
            *("--allow-net", "127.0.0.0/8", "--set", "shards=2", "--set", "host_delay_s=0"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=writer,
            env={**env, "TMPDIR": str(tmp_path), "COLUMNS": "120"},
        )
        os.close(writer)
        async with asyncio.timeout(120):
            await proc.wait()
    shown = b""
    with contextlib.suppress(OSError):  # EIO once the other end is closed and read
        while chunk := os.read(reader, 65536):
            shown += chunk
    os.close(reader)
    assert proc.returncode == 0
    text = shown.decode(errors="replace")
    assert "pages 2  rate" in text, text
    assert "progress:" not in text, "a panel, not log lines"
