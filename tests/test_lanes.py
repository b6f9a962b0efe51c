"""The lane schedule of one shard, as pure logic: levels first with guaranteed shares, then jobs
by weight; the board's reading of the task stream's subjects; and a task's level."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from jetcrawl.contract.jobs import JobSpec
from jetcrawl.contract.messages import Lineage, Task
from jetcrawl.dispatcher.jobrules import level_of
from jetcrawl.worker.lanes import JobRates, LaneBoard, Schedule

WEIGHTS = (8, 4, 2, 1)


def one_weight(job: str) -> int:
    return 1


def take(
    schedule: Schedule,
    backlog: dict[tuple[int, str], int],
    turns: int,
    room: int = 64,
    weight: Callable[[str], int] = one_weight,
) -> list[tuple[int, str]]:
    """Take ``turns`` tasks one pull at a time, as a shard's puller does; the lanes taken from,
    one entry a task."""
    taken: list[tuple[int, str]] = []
    while len(taken) < turns:
        ready = {lane: n for lane, n in backlog.items() if n > 0}
        pick = schedule.next(ready, min(room, turns - len(taken)), weight)
        if pick is None:
            break
        lane, n = pick
        assert 1 <= n <= ready[lane]
        backlog[lane] -= n
        schedule.took(lane, n, {level for level, _ in ready}, weight)
        taken += [lane] * n
    return taken


def test_a_burst_of_a_higher_level_goes_first_whole() -> None:
    # 20 tasks at level 0 and 20 at level 1 ready at once: every level-0 task first.
    schedule = Schedule(WEIGHTS, slack=32)
    taken = take(schedule, {(0, "j"): 20, (1, "j"): 20}, 40)
    assert [level for level, _ in taken] == [0] * 20 + [1] * 20


def test_the_lowest_level_gets_at_least_its_share_over_a_long_run() -> None:
    schedule = Schedule(WEIGHTS, slack=32)
    backlog = {(level, "j"): 10**9 for level in range(4)}
    taken = Counter(level for level, _ in take(schedule, backlog, 30_000))
    for level, weight in enumerate(WEIGHTS):
        assert taken[level] >= 30_000 * weight / sum(WEIGHTS) - 64, (level, taken)
    # and the guarantees are what the lower levels get, no more: level 0 takes the rest
    assert taken[3] <= 30_000 / 15 + 64


def test_a_level_with_nothing_waiting_banks_no_share() -> None:
    schedule = Schedule(WEIGHTS, slack=32)
    take(schedule, {(0, "j"): 10_000}, 10_000)  # level 3 had nothing: it is owed nothing
    taken = take(schedule, {(0, "j"): 20, (3, "j"): 20}, 40)
    assert [level for level, _ in taken][:20] == [0] * 20


def test_without_the_weights_a_negative_case_would_starve_the_lowest_level() -> None:
    # slack beyond the run: strict precedence only, so level 3 gets nothing in 1,000 turns.
    schedule = Schedule(WEIGHTS, slack=10**9)
    backlog = {(level, "j"): 10**9 for level in range(4)}
    assert Counter(level for level, _ in take(schedule, backlog, 1000))[3] == 0


def test_two_jobs_of_a_level_share_it_by_weight() -> None:
    weights = {"big": 3, "small": 1}
    schedule = Schedule(WEIGHTS, slack=32)
    taken = take(schedule, {(2, "big"): 10**6, (2, "small"): 10**6}, 4000, weight=weights.get)
    share = Counter(job for _, job in taken)["big"] / len(taken)
    assert abs(share - 0.75) < 0.01, share


def test_a_job_that_starts_waiting_is_not_repaid_for_the_time_it_had_nothing() -> None:
    schedule = Schedule(WEIGHTS, slack=32)
    take(schedule, {(2, "a"): 1000}, 1000)
    taken = take(schedule, {(2, "a"): 10**6, (2, "b"): 10**6}, 200)
    share = Counter(job for _, job in taken)["b"] / len(taken)
    assert 0.4 <= share <= 0.6, share  # even from here, not 1,000 turns of b first


def test_the_board_reads_lanes_and_wakes_a_shard_whose_lanes_gain() -> None:
    board = LaneBoard(js=None, poll_s=1.0)  # type: ignore[arg-type]  # update() needs no server
    woken: list[int] = []
    board.on_gain(3, lambda: woken.append(3))
    board.update({"crawl.tasks.3.0.a": 2, "crawl.tasks.3.2.b": 5, "crawl.tasks.1.2.b": 1})
    assert board.lanes(3) == {(0, "a"): 2, (2, "b"): 5}
    assert (board.job_total("b"), board.job_on("b", [3])) == (6, 5)
    assert woken == [3]
    board.update({"crawl.tasks.3.0.a": 1, "crawl.tasks.3.2.b": 5, "crawl.tasks.9": 4})
    assert woken == [3], "fewer tasks wake nobody; a subject that is no lane is left out"
    assert board.lanes(9) == {}


def test_a_jobs_rate_gives_tokens_at_its_pace() -> None:
    now = [0.0]
    rates = JobRates(clock=lambda: now[0])
    assert rates.available("j", 2.0) == 1
    rates.spend("j", 1)
    assert rates.available("j", 2.0) == 0
    now[0] = 0.5
    assert rates.available("j", 2.0) == 1
    now[0] = 100.0
    assert rates.available("j", 2.0) == 2, "at most a second's worth is saved up"


def test_fetch_tokens_save_up_no_burst() -> None:
    now = [0.0]
    rates = JobRates(clock=lambda: now[0], burst_s=0.0)
    rates.spend("j", rates.available("j", 5.0))
    now[0] = 100.0  # a long wait (robots.txt, a host's turn) saves up one token, no more
    assert rates.available("j", 5.0) == 1
    rates.spend("j", 1)
    now[0] = 100.5  # half a second at 5/s makes 2.5 tokens: one is kept
    assert rates.available("j", 5.0) == 1


def test_a_tasks_level_is_its_own_then_the_specs_rule_then_its_seeds_then_the_default() -> None:
    spec = JobSpec.read(
        {"name": "j", "priority": {"default": 3, "rules": [{"match": "/hot/", "level": 0}]}}
    )
    seeded = Lineage("j", "host", "a.test", 3, priority=1)
    plain = Lineage("j", "host", "a.test", 3)

    def task(path: str, lineage: Lineage, prio: int | None = None) -> Task:
        return Task(f"http://a.test{path}", "f", 1, lineage, None, 0, prio)

    assert level_of(task("/hot/1", seeded, prio=2), spec, 2) == 2  # a plugin's or seed's own
    assert level_of(task("/hot/1", seeded), spec, 2) == 0  # the spec's rule
    assert level_of(task("/cold", seeded), spec, 2) == 1  # the seed's, inherited
    assert level_of(task("/cold", plain), spec, 2) == 3  # the spec's default
    assert level_of(task("/cold", plain), None, 1) == 1  # the settings'
