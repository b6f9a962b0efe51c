"""The dispatcher's admission as pure functions: what to mark, and which tasks to publish."""

from __future__ import annotations

from jetcrawl.contract.messages import Lineage, Task
from jetcrawl.contract.urls import fingerprint
from jetcrawl.dispatcher.admission import candidates, decide, unknown_origins
from jetcrawl.dispatcher.intake import Reading
from jetcrawl.dispatcher.quota import host_key
from jetcrawl.dispatcher.seen import UNKNOWN, Mark

LINEAGE = Lineage(job="default", scope="any", root="", max_depth=3)


def task(path: str, host: str = "a.example") -> Task:
    url = f"http://{host}/{path}"
    return Task(url=url, fp=fingerprint(url), depth=1, lineage=LINEAGE)


def nothing_cached(key: str) -> Mark | None:
    return None


def test_a_new_url_is_marked_once_and_published_by_the_first_message_that_has_it() -> None:
    a, b = task("a"), task("b")
    readings = [Reading(tasks=[a, b]), Reading(tasks=[b])]
    c = candidates([10, 11], readings, nothing_cached)
    assert c.to_create == {a.seen_key: 10, b.seen_key: 10}
    assert c.by_host == {host_key("default", "a.example"): [a.seen_key, b.seen_key]}
    assert c.by_job == {"default": [a.seen_key, b.seen_key]}
    created = {a.seen_key: Mark(10, 1), b.seen_key: Mark(10, 2)}
    decision = decide(c, [10, 11], [None, None], created, recrawl=False)
    assert decision.tasks == [(0, a), (0, b)]
    assert (decision.admitted, decision.republished, decision.duplicates) == (2, 0, 1)


def test_a_cached_mark_is_a_duplicate_on_a_first_delivery() -> None:
    a = task("a")
    c = candidates([10], [Reading(tasks=[a])], lambda key: Mark(3, 7))
    assert c.to_create == {} and c.known == {a.seen_key: Mark(3, 7)}
    decision = decide(c, [10], [None], {}, recrawl=False)
    assert (decision.tasks, decision.duplicates) == ([], 1)


def test_a_redelivery_publishes_the_marks_it_made_before_and_nothing_else() -> None:
    mine, theirs = task("mine"), task("theirs")
    c = candidates([10], [Reading(tasks=[mine, theirs])], nothing_cached)
    # Both creates find a mark already there (made by an earlier delivery, or by another message).
    for key in list(c.to_create):
        c.known[key] = UNKNOWN
    owned: list[tuple[int, ...] | None] = [(10,)]
    assert unknown_origins(c, owned) == {mine.seen_key, theirs.seen_key}, "to be read first"
    c.known[mine.seen_key] = Mark(10, 1)  # what the reads say
    c.known[theirs.seen_key] = Mark(4, 1)
    decision = decide(c, [10], owned, {}, recrawl=False)
    assert decision.tasks == [(0, mine)]
    assert (decision.admitted, decision.republished, decision.duplicates) == (0, 1, 1)
    assert unknown_origins(c, [None]) == set(), "a first delivery reads nothing"


def test_a_replayed_message_owns_the_sequences_it_came_from() -> None:
    a = task("a")
    c = candidates([99], [Reading(tasks=[a])], lambda key: Mark(12, 3))
    decision = decide(c, [99], [(99, 12)], {}, recrawl=False)
    assert decision.tasks == [(0, a)] and decision.republished == 1


def test_a_quota_refusal_drops_the_key_and_with_recrawl_a_task_carries_its_revision() -> None:
    a, b = task("a"), task("b")
    c = candidates([10], [Reading(tasks=[a, b])], nothing_cached)
    c.drop([b.seen_key])
    assert list(c.to_create) == [a.seen_key]
    decision = decide(c, [10], [None], {a.seen_key: Mark(10, 5)}, recrawl=True)
    [(index, published)] = decision.tasks
    assert (index, published.url, published.gen) == (0, a.url, 5)
    assert decision.duplicates == 1, "the refused one has no mark: not published"
