"""Seed decoding and the internal wire shapes."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from jetcrawl.contract.deadletters import ORIGIN_HEADER, DeadLetter, origins_of
from jetcrawl.contract.errors import MessageError
from jetcrawl.contract.messages import (
    Discovered,
    Lineage,
    Result,
    ResultHead,
    Seed,
    SeedReject,
    Task,
    WorkerReport,
    decode_seeds,
)

LINEAGE = Lineage(job="default", scope="host", root="example.com", max_depth=3)


def test_one_url() -> None:
    assert decode_seeds(b"https://example.com/\n") == [Seed("https://example.com/")]


def test_urls_one_per_line_with_blank_lines_and_comments() -> None:
    body = b"https://a.example/\r\n\n# a comment\n  https://b.example/x  \n"
    assert decode_seeds(body) == [Seed("https://a.example/"), Seed("https://b.example/x")]


def test_json_object_with_options() -> None:
    body = b'{"url": "https://a.example/", "max_depth": 2, "scope": "domain", "job": "news"}'
    assert decode_seeds(body) == [Seed("https://a.example/", 2, "domain", "news")]


def test_json_list_of_objects_and_strings() -> None:
    body = b'[{"url": "https://a.example/"}, "https://b.example/"]'
    assert decode_seeds(body) == [Seed("https://a.example/"), Seed("https://b.example/")]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x00\x01\x02garbage", "binary"),
        (b"\xff\xfe not utf-8", "invalid_utf8"),
        (b'{"url": ', "invalid_json"),
        (b"   ", "empty"),
        (b"[]", "empty"),
        (b'{"url": 42}', "wrong_type"),
        (b'{"url": "https://a.example/", "max_depth": "2"}', "wrong_type"),
        (b'{"url": "https://a.example/", "max_depth": true}', "wrong_type"),
        (b'{"url": "https://a.example/", "max_depth": -1}', "wrong_type"),
        (b'{"url": "https://a.example/", "scope": "planet"}', "bad_scope"),
        (b'{"url": "https://a.example/", "job": "no spaces"}', "bad_job"),
        (b'{"url": "https://a.example/", "maxdepth": 2}', "unknown_field"),
        (b'{"v": 2, "url": "https://a.example/"}', "unknown_version"),
        (b'{"max_depth": 2}', "missing_field"),
        (b"[1]", "wrong_type"),
        (b"https://a.example/ https://b.example/", "invalid_url"),
    ],
)
def test_bad_seed_bodies_are_rejected_with_a_reason(body: bytes, reason: str) -> None:
    out = decode_seeds(body)
    assert [type(x) for x in out] == [SeedReject]
    assert isinstance(out[0], SeedReject) and out[0].reason == reason


def test_bad_items_do_not_cost_the_good_ones() -> None:
    out = decode_seeds(b'[{"url": "https://a.example/"}, {"url": 1}, "https://b.example/"]')
    assert [type(x) for x in out] == [Seed, SeedReject, Seed]


def test_task_round_trip() -> None:
    task = Task("https://example.com/a", "ab" * 16, 2, LINEAGE, parent="https://example.com/")
    assert Task.from_wire(task.to_wire()) == task


def test_discovered_round_trip_and_lenient_unknown_fields() -> None:
    page = Discovered("https://example.com/", "cd" * 16, 1, LINEAGE, ("https://example.com/a",))
    obj = orjson.loads(page.to_wire()) | {"a_future_optional_field": 1}
    assert Discovered.from_wire(orjson.dumps(obj)) == page


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"v": 2}, "unknown_version"),
        ({"v": None}, "missing_version"),
        ({"v": "1"}, "wrong_type"),
        ({"depth": "1"}, "wrong_type"),
        ({"links": "https://example.com/"}, "wrong_type"),
        ({"links": [1]}, "wrong_type"),
        ({"scope": "planet"}, "bad_scope"),
    ],
)
def test_internal_messages_are_strict(change: dict[str, object], reason: str) -> None:
    page = Discovered("https://example.com/", "cd" * 16, 1, LINEAGE, ("https://example.com/a",))
    obj = orjson.loads(page.to_wire()) | change
    with pytest.raises(MessageError) as e:
        Discovered.from_wire(orjson.dumps(obj))
    assert e.value.reason == reason


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"url": None}, "missing_field"),
        ({"url": 1}, "wrong_type"),
        ({"depth": True}, "wrong_type"),
        ({"depth": -1}, "wrong_type"),
        ({"depth": 1.0}, "wrong_type"),
        ({"parent": 1}, "wrong_type"),
        ({"gen": False}, "wrong_type"),
        ({"gen": "1"}, "wrong_type"),
        ({"max_depth": True}, "wrong_type"),
        ({"max_depth": 5.0}, "wrong_type"),
        ({"max_depth": [5]}, "wrong_type"),
        ({"job": "no spaces"}, "bad_job"),
        ({"scope": "planet"}, "bad_scope"),
        ({"root": None}, "missing_field"),
    ],
)
def test_tasks_are_strict_even_with_their_lineage_seen_before(
    change: dict[str, object], reason: str
) -> None:
    task = Task("https://example.com/a", "ab" * 16, 2, LINEAGE, parent="https://example.com/")
    assert Task.from_wire(task.to_wire()) == task  # its lineage is now known
    obj = orjson.loads(task.to_wire()) | change
    with pytest.raises(MessageError) as e:
        Task.from_wire(orjson.dumps(obj))
    assert e.value.reason == reason


def test_a_lineage_seen_before_is_the_same_object() -> None:
    first = Task("https://example.com/a", "ab" * 16, 2, LINEAGE)
    second = Task("https://example.com/b", "cd" * 16, 3, LINEAGE, gen=4)
    one, two = Task.from_wire(first.to_wire()), Task.from_wire(second.to_wire())
    assert (one, two) == (first, second)
    assert one.lineage is two.lineage


def test_not_json_at_all() -> None:
    with pytest.raises(MessageError) as e:
        Task.from_wire(b"\x00garbage")
    assert e.value.reason == "invalid_json"


def test_dead_letter_bounds_and_keeps_binary_originals() -> None:
    letter = DeadLetter.of("seeds", "binary", "", "crawl.seeds", 1.5, b"\xff" * 100, max_bytes=10)
    back = DeadLetter.from_wire(letter.to_wire())
    assert back.original == b"\xff" * 10 and back.original_size == 100
    assert orjson.loads(letter.to_wire())["truncated"] is True


def test_a_dead_letter_carries_the_frontier_sequences_it_came_from() -> None:
    letter = DeadLetter.of(
        "frontier", "max_deliveries", "", "crawl.seeds", 1.5, b"x", 10, 7, origins=(3, 7)
    )
    assert DeadLetter.from_wire(letter.to_wire()).origins == (3, 7)
    plain = DeadLetter.of("seeds", "too_long", "", "crawl.seeds", 1.5, b"x", 10)
    assert "origins" not in orjson.loads(plain.to_wire())  # other letters are as they were
    assert DeadLetter.from_wire(plain.to_wire()).origins == ()
    for bad in ([0], ["3"], [True], 3):
        wire = orjson.loads(letter.to_wire()) | {"origins": bad}
        with pytest.raises(MessageError, match="origins"):
            DeadLetter.from_wire(orjson.dumps(wire))


def test_a_replayed_frontier_message_names_its_origins_in_a_header() -> None:
    assert origins_of(None) == () and origins_of({"Nats-Msg-Id": "x"}) == ()
    assert origins_of({ORIGIN_HEADER: "12,345"}) == (12, 345)
    for bad in ("", "12,", "x", "0", "-4"):
        with pytest.raises(MessageError, match=ORIGIN_HEADER):
            origins_of({ORIGIN_HEADER: bad})


def _result_obj() -> dict[str, object]:
    url = "https://example.com/a"
    return Result(
        url=url, fp="ab" * 16, job="default", depth=1, parent="https://example.com/",
        outcome="fetched", status=200, final_url=url, redirects=(), content_type="text/html",
        length=10, title=None, outlinks=0, fetched_at=1.0, elapsed_ms=2.0, shard=3, fence=4,
        worker="w1",
    ).to_obj()  # fmt: skip


@pytest.mark.parametrize(
    "change",
    [
        {"v": 99},
        {"fp": 7},
        {"outcome": "exploded"},
        {"status": True},
        {"status": "200"},
    ],
    ids=["version", "fp", "outcome", "status bool", "status str"],
)
def test_a_result_head_refuses_what_the_full_record_refuses(change: dict[str, object]) -> None:
    data = orjson.dumps(_result_obj() | change)
    with pytest.raises(MessageError) as full:
        Result.from_wire(data)
    with pytest.raises(MessageError) as head:
        ResultHead.from_wire(data)
    assert head.value.reason == full.value.reason


def test_a_result_head_reads_its_fields_and_builds_the_same_record() -> None:
    data = orjson.dumps(_result_obj())
    head = ResultHead.from_wire(data)
    assert (head.fp, head.outcome, head.status) == ("ab" * 16, "fetched", 200)
    assert head.record() == Result.from_wire(data)


def test_a_worker_report_round_trips_and_a_newer_major_version_is_refused() -> None:
    report = WorkerReport(
        worker="w1",
        at=1_700_000_000.5,
        held=12,
        waiting=9,
        handed_back=40,
        handbacks_due=3,
        furthest_due_at=1_700_000_047.25,
    )
    assert WorkerReport.from_wire(report.to_wire()) == report
    idle = dataclasses.replace(report, handbacks_due=0, furthest_due_at=None)
    assert WorkerReport.from_wire(idle.to_wire()) == idle
    newer = orjson.loads(report.to_wire()) | {"v": 2}
    with pytest.raises(MessageError) as e:
        WorkerReport.from_wire(orjson.dumps(newer))
    assert e.value.reason == "unknown_version"
