"""OnePerPass: one waiter through per pass of the event loop, in arrival order."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from jetcrawl.worker.passes import OnePerPass


class Passes:
    """Counts the loop's passes: a callback that puts itself back on the ready queue runs once
    a pass."""

    def __init__(self) -> None:
        self.count = 0
        self._handle: asyncio.Handle | None = None

    def start(self) -> None:
        self.count += 1
        self._handle = asyncio.get_running_loop().call_soon(self.start)

    def stop(self) -> None:
        assert self._handle is not None
        self._handle.cancel()


async def _through(gate: OnePerPass, passes: Passes, name: str, log: list[tuple[str, int]]) -> None:
    await gate.wait()
    log.append((name, passes.count))


async def test_waiters_go_through_one_per_pass_in_arrival_order() -> None:
    gate, passes, log = OnePerPass(), Passes(), []
    passes.start()
    tasks = [asyncio.create_task(_through(gate, passes, str(i), log)) for i in range(6)]
    await asyncio.gather(*tasks)
    passes.stop()
    assert [name for name, _ in log] == [str(i) for i in range(6)]
    at = [count for _, count in log]
    assert all(later > earlier for earlier, later in itertools.pairwise(at)), at


async def test_an_idle_gate_lets_a_waiter_through_without_waiting() -> None:
    gate = OnePerPass()
    first = gate.wait()
    with pytest.raises(StopIteration):
        first.send(None)  # through without suspending
    second = gate.wait()
    waits_on = second.send(None)  # the same pass: it waits
    assert isinstance(waits_on, asyncio.Future) and not waits_on.done()
    await asyncio.sleep(0)  # the next pass lets it through
    assert waits_on.done()
    with pytest.raises(StopIteration):
        second.send(None)
    await asyncio.sleep(0)  # a pass with nobody waiting opens the gate again
    third = gate.wait()
    with pytest.raises(StopIteration):
        third.send(None)


async def test_a_cancelled_waiter_holds_up_no_one() -> None:
    gate, passes, log = OnePerPass(), Passes(), []
    passes.start()
    names = ("first", "gone", "kept")
    first, gone, kept = (asyncio.create_task(_through(gate, passes, n, log)) for n in names)
    await asyncio.sleep(0)  # all three ran: the first went through, the other two wait
    assert first.done() and not gone.done()
    gone.cancel()
    await asyncio.wait_for(kept, timeout=5)
    passes.stop()
    assert [name for name, _ in log] == ["first", "kept"]
    assert gone.cancelled()
