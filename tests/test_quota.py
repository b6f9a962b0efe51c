"""dispatcher/quota.py on a real server: a counter's change is one write where the dispatcher
met the counter before, and stays exact when another dispatcher moved it meanwhile."""

from __future__ import annotations

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from jetcrawl.dispatcher.quota import AdmissionQuota


async def test_a_counter_changes_with_one_write_where_it_was_met_before(
    nc: NATS, js: JetStreamContext
) -> None:
    quota = AdmissionQuota(await js.create_key_value(bucket="quota"), 10)
    for granted in (4, 4):
        sent = nc.stats["out_msgs"]
        assert await quota.reserve("job", 4) == granted
        assert nc.stats["out_msgs"] - sent == 1, "a write, and no read before it"
    assert await quota.used("job") == 8


async def test_a_counter_another_dispatcher_moved_is_read_again(js: JetStreamContext) -> None:
    kv = await js.create_key_value(bucket="quota")
    one, two = AdmissionQuota(kv, 10), AdmissionQuota(kv, 10)
    assert await one.reserve("job", 4) == 4
    assert await two.reserve("job", 4) == 4  # its create finds the counter: read, then written
    assert await one.reserve("job", 4) == 2, "its remembered 4 was stale: 8 were taken"
    assert await two.reserve("job", 1) == 0
    assert await one.used("job") == 10


async def test_a_full_counter_is_read_again_before_a_refusal(js: JetStreamContext) -> None:
    kv = await js.create_key_value(bucket="quota")
    one, two = AdmissionQuota(kv, 10), AdmissionQuota(kv, 10)
    assert await one.reserve("job", 10) == 10
    await two.give_back("job", 3)  # another dispatcher's unused admissions come back
    assert await one.reserve("job", 5) == 3, "not refused on the full count it remembered"
    assert await two.used("job") == 10


async def test_a_counter_two_dispatchers_take_turns_on_is_read_first(
    nc: NATS, js: JetStreamContext
) -> None:
    kv = await js.create_key_value(bucket="quota")
    one, two = AdmissionQuota(kv, 100), AdmissionQuota(kv, 100)
    for quota in (one, two, one, two):  # each finds the other moved it: marked, read next time
        await quota.reserve("job", 1)
    sent = nc.stats["out_msgs"]
    assert await one.reserve("job", 1) == 1
    assert nc.stats["out_msgs"] - sent == 2, "a read and a write, no failed write first"
    assert await one.used("job") == 5


async def test_a_deleted_counter_is_written_over(js: JetStreamContext) -> None:
    kv = await js.create_key_value(bucket="quota")
    quota = AdmissionQuota(kv, 10)
    assert await quota.reserve("job", 6) == 6
    await kv.delete("admitted.job")  # reset by hand
    assert await quota.reserve("job", 6) == 6
    assert await quota.used("job") == 6
