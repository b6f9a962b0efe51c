"""Results out: `jetcrawl results` as JSON lines and as WARC 1.1, read back with warcio."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import signal
import sys
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.js import JetStreamContext
from warcio.archiveiterator import ArchiveIterator

from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.messages import Result
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import result_subject
from jetcrawl.local.embedded import NatsServer
from jetcrawl.ops.results import parse_since
from jetcrawl.plumbing.bodies import BodyStore, payload_digest
from jetcrawl.plumbing.bus import MSG_ID
from jetcrawl.plumbing.topology import ensure

BODY = "<html><head><title>Ünïcode</title></head><body>" + "x" * 300_000 + "</body></html>"


def record(n: int, job: str, **changes: object) -> Result:
    base = Result(
        url=f"http://127.0.0.2:8000/p{n}",
        fp=f"{n:032x}",
        job=job,
        depth=1,
        parent="http://127.0.0.2:8000/",
        outcome="fetched",
        status=200,
        final_url=f"http://127.0.0.2:8000/p{n}",
        redirects=(),
        content_type="text/html",
        length=0,
        title=None,
        outlinks=0,
        fetched_at=1_764_000_000.0 + n,
        elapsed_ms=3.0,
        shard=n % 4,
        fence=7,
        worker="w1",
        headers={"content-type": "text/html; charset=utf-8", "server": "test"},
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


async def publish(js: JetStreamContext, results: list[Result]) -> None:
    for r in results:
        await js.publish(result_subject(r.shard), r.to_wire(), headers={MSG_ID: r.fp})


async def cli(*args: str) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jetcrawl",
        "results",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out, err


@pytest.fixture
async def stored(nats_server: NatsServer, js: JetStreamContext) -> list[Result]:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    bodies = await BodyStore.open(js)
    body = BODY.encode()
    ref, digest = await bodies.put(f"{1:032x}", body)
    results = [
        record(1, "a", length=len(body), body_ref=ref, payload_digest=digest),
        record(2, "b"),
        record(3, "a", status=404, headers={"content-type": "text/html"}),
        record(4, "a", outcome="robots_disallowed", status=None, final_url=None),
        record(
            5,
            "a",
            content_type="application/pdf",
            length=12345,
            headers={"content-type": "application/pdf", "content-length": "12345"},
        ),
    ]
    await publish(js, results)
    return results


async def test_jsonl_export_equals_the_records_filtered_by_job(
    nats_server: NatsServer, stored: list[Result]
) -> None:
    code, out, err = await cli("--nats", nats_server.url, "--job", "a")
    assert code == 0, err
    lines = out.splitlines()
    assert [Result.from_wire(line) for line in lines] == [r for r in stored if r.job == "a"]
    assert all(orjson.loads(line)["v"] == 1 for line in lines)


async def test_warc_export_reads_back_with_matching_payload_digests(
    nats_server: NatsServer, stored: list[Result], tmp_path: Path
) -> None:
    out = tmp_path / "crawl.warc.gz"
    code, _, err = await cli("--nats", nats_server.url, "--job", "a", "-o", str(out))
    assert code == 0, err
    assert b"1 without a WARC form skipped" in err  # the robots denial

    with out.open("rb") as f:
        records = []
        cdxj = []
        it = ArchiveIterator(f)
        for rec in it:
            payload = rec.content_stream().read()
            records.append((rec.rec_type, rec.rec_headers, rec.http_headers, payload))
            if rec.rec_type == "response":
                uri = rec.rec_headers.get_header("WARC-Target-URI")
                stamp = rec.rec_headers.get_header("WARC-Date")
                cdxj.append(
                    f"{surt(uri)} {stamp} "
                    + orjson.dumps(
                        {
                            "url": uri,
                            "offset": it.get_record_offset(),
                            "length": it.get_record_length(),
                        }
                    ).decode()
                )
    types = [r[0] for r in records]
    assert types[0] == "warcinfo"
    assert types[1:] == ["request", "response"] * 3  # p1, p3 (404), p5 (pdf)
    responses = {r[1].get_header("WARC-Target-URI"): r for r in records if r[0] == "response"}
    p1 = responses["http://127.0.0.2:8000/p1"]
    assert p1[3] == BODY.encode()
    sha1 = "sha1:" + base64.b32encode(hashlib.sha1(BODY.encode()).digest()).decode()
    assert p1[1].get_header("WARC-Payload-Digest") == sha1 == payload_digest(BODY.encode())
    assert p1[1].get_header("WARC-Date").startswith("2025-11-24T")
    assert p1[2].get_statuscode() == "200"
    assert p1[2].get_header("Content-Length") == str(len(BODY.encode()))
    assert responses["http://127.0.0.2:8000/p3"][2].get_statuscode() == "404"
    pdf = responses["http://127.0.0.2:8000/p5"]
    assert pdf[1].get_header("WARC-Truncated") == "length", "body not kept: said so"
    for rec_type, headers, _, _ in records:
        if rec_type == "request":
            assert headers.get_header("WARC-Concurrent-To") is None
        if rec_type == "response":
            assert headers.get_header("WARC-Concurrent-To", "").startswith("<urn:uuid:")
    assert len(cdxj) == 3
    assert cdxj[0].startswith(surt("http://127.0.0.2:8000/p1") + " 2025-11-24T")


def surt(uri: str) -> str:
    """The CDXJ sort key: host reversed by label, then the path (enough for this test)."""
    rest = uri.split("://", 1)[1]
    host, _, path = rest.partition("/")
    name, _, port = host.partition(":")
    key = ",".join(reversed(name.split(".")))
    return f"{key}{':' + port if port else ''})/{path}"


async def test_since_filters_by_time(nats_server: NatsServer, js: JetStreamContext) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    await publish(js, [record(1, "a")])
    cut = time.time()
    await publish(js, [record(2, "a")])
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(cut))
    code, out, _ = await cli("--nats", nats_server.url, "--since", since)
    assert code == 0
    assert [Result.from_wire(line).fp for line in out.splitlines()] in (
        [f"{2:032x}"],
        [f"{1:032x}", f"{2:032x}"],  # same-second publishes: ISO has 1 s steps
    )
    code, out, _ = await cli("--nats", nats_server.url, "--since", "1h")
    assert len(out.splitlines()) == 2


def test_parse_since() -> None:
    assert parse_since("15m", now=1000.0) == 100.0
    assert parse_since("2026-11-29T10:00:00Z") == parse_since("2026-11-29T10:00:00+00:00")
    with pytest.raises(JetcrawlError):
        parse_since("yesterday")


async def test_bodies_are_stored_once_per_content(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    bodies = await BodyStore.open(js)
    big = (b"<p>a page of some size</p>\n" * 200_000)[: 3 * 1024 * 1024]  # over 1 MiB: chunked
    first = await bodies.put("f" * 32, big)
    again = await bodies.put("f" * 32, big)
    assert first == again and await bodies.get(first[0]) == big
    on_disk = sum(
        f.stat().st_size
        for f in nats_server.store_dir.rglob("*")
        if f.is_file() and "OBJ_crawl_bodies" in f.parts
    )
    assert 0 < on_disk < len(big) // 10, "compressed on disk"


async def test_follow_writes_records_as_they_arrive_until_interrupted(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    await publish(js, [record(1, "a")])
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jetcrawl",
        "results",
        "--nats",
        nats_server.url,
        "--follow",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(20):
            first = await proc.stdout.readline()
            await publish(js, [record(2, "b")])
            second = await proc.stdout.readline()
        assert [Result.from_wire(line).fp for line in (first, second)] == [
            f"{1:032x}",
            f"{2:032x}",
        ]
    finally:
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            await proc.wait()
    assert proc.returncode == 0


@given(st.binary(max_size=3000))
def test_the_payload_digest_is_the_sha1_in_base32_as_warc_writes_it(body: bytes) -> None:
    expected = "sha1:" + base64.b32encode(hashlib.sha1(body).digest()).decode()
    assert payload_digest(body) == expected
