"""The pure state under every gate's queue (capacity/slot_queue.py): any sequence of takes,
waits, cancellations, releases and resizes keeps its rules. Checked against a plain list of
the waiters and a count of the slots: never a grant past the size, never a free slot beside a
waiter who may take it, and each freed slot to the best-ranked waiter allowed to hold it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_gateway.capacity.slot_queue import NO_RESERVATION, Reservation, SlotQueue, Waiter

RESERVATIONS = st.sampled_from([NO_RESERVATION, Reservation(1, 0), Reservation(2, 1)])


class SlotQueueRules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = SlotQueue(3, Reservation(1, 0))
        self.names = itertools.count()
        self.holders: dict[str, int] = {}  # borrower -> priority
        self.waiters: list[Waiter] = []  # live, in the order queued

    def capped(self, priority: int) -> bool:
        return self.queue.reservation.capped(priority)

    def may_take(self, capped: bool) -> bool:
        total, slots = self.queue.total_tokens, self.queue.reservation.slots
        if len(self.holders) >= total:
            return False
        capped_held = sum(map(self.capped, self.holders.values()))
        return not capped or capped_held < total - slots

    def check_granted(self, granted: Sequence[Waiter]) -> None:
        for waiter in granted:
            eligible = [w for w in self.waiters if self.may_take(self.capped(w.priority))]
            assert eligible, "a grant with no slot free for it"
            assert waiter is min(eligible, key=lambda w: (w.rank, w.serial))
            self.waiters.remove(waiter)
            self.holders[str(waiter.borrower)] = waiter.priority

    @rule(priority=st.integers(0, 3))
    def take(self, priority: int) -> None:
        name = f"b{next(self.names)}"
        capped = self.capped(priority)
        ahead = [w for w in self.waiters if not self.capped(w.priority) or capped]
        expected = not ahead and self.may_take(capped)
        assert self.queue.take_nowait(name, priority) is expected
        if expected:
            self.holders[name] = priority

    @rule(priority=st.integers(0, 3), rank=st.integers(0, 5))
    def wait(self, priority: int, rank: int) -> None:
        name = f"b{next(self.names)}"
        if self.queue.take_nowait(name, priority):
            self.holders[name] = priority
            return
        self.waiters.append(self.queue.enqueue(name, float(rank), priority, name))

    @precondition(lambda self: self.waiters)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        waiter = data.draw(st.sampled_from(self.waiters))
        self.queue.cancel(waiter)
        self.waiters.remove(waiter)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.holders)))
        del self.holders[name]
        self.check_granted(self.queue.release(name))

    @rule(total=st.integers(3, 5), reservation=RESERVATIONS)
    def resize(self, total: int, reservation: Reservation) -> None:
        self.check_granted(self.queue.resize(total, reservation))

    @invariant()
    def counts_agree(self) -> None:
        stats = self.queue.statistics()
        assert stats.borrowed_tokens == len(self.holders)
        assert stats.tasks_waiting == len(self.waiters)
        assert stats.capped_borrowed == sum(map(self.capped, self.holders.values()))

    @invariant()
    def no_free_slot_beside_a_waiter_who_may_take_it(self) -> None:
        for waiter in self.waiters:
            assert not self.may_take(self.capped(waiter.priority))


TestSlotQueue = SlotQueueRules.TestCase
TestSlotQueue.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_a_release_by_a_non_holder_and_a_second_take_are_refused() -> None:
    queue = SlotQueue(1)
    assert queue.take_nowait("a")
    with pytest.raises(RuntimeError):
        queue.take_nowait("a")
    with pytest.raises(RuntimeError):
        queue.enqueue("a", 0.0, 0, None)
    with pytest.raises(RuntimeError):
        queue.release("b")
    assert queue.release("a") == ()
    with pytest.raises(ValueError, match="reservation"):
        SlotQueue(2, Reservation(2, 0))
