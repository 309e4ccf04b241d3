"""LocalGate: a provider's slots in one process (trio's CapacityLimiter), on a mock clock."""

from __future__ import annotations

import random

import trio
import trio.testing

from trio_gateway.capacity.gate import GateStats, LocalGate


async def test_never_more_than_max_inflight_holders(autojump_clock: trio.testing.MockClock) -> None:
    gate = LocalGate(5)
    rng = random.Random(7)
    holders = peak = served = 0

    async def borrower() -> None:
        nonlocal holders, peak, served
        me = object()
        await gate.acquire(me)
        try:
            holders += 1
            peak = max(peak, holders)
            await trio.sleep(rng.uniform(0.01, 0.5))
        finally:
            holders -= 1
            await gate.release(me)
        served += 1

    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(borrower)
        await trio.testing.wait_all_tasks_blocked()
        assert gate.statistics() == GateStats(in_flight=5, waiting=45, max_inflight=5)
    assert peak == 5
    assert served == 50
    assert gate.statistics() == GateStats(in_flight=0, waiting=0, max_inflight=5)


async def test_cancel_while_waiting_leaves_nothing_held(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = LocalGate(1)
    holder, waiter = object(), object()
    await gate.acquire(holder)
    with trio.move_on_after(1.0) as timed_out:
        await gate.acquire(waiter)
    assert timed_out.cancelled_caught
    assert gate.statistics() == GateStats(in_flight=1, waiting=0, max_inflight=1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.acquire, waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert gate.statistics().waiting == 1
        nursery.cancel_scope.cancel()
    assert gate.statistics() == GateStats(in_flight=1, waiting=0, max_inflight=1)

    await gate.release(holder)
    assert gate.statistics().in_flight == 0
    # The cancelled waiter holds nothing: it may take the slot as a new borrower would.
    assert gate.try_acquire_nowait(waiter)


async def test_resize_down_keeps_the_holders_and_admits_below_the_new_limit() -> None:
    gate = LocalGate(3)
    a, b, c, d = object(), object(), object(), object()
    for who in (a, b, c):
        assert await gate.try_acquire(who)
    gate.resize(1)
    assert gate.statistics() == GateStats(in_flight=3, waiting=0, max_inflight=1)
    assert not await gate.try_acquire(d)
    await gate.release(a)
    await gate.release(b)
    assert gate.statistics().in_flight == 1
    assert not await gate.try_acquire(d)  # 1 held, 1 allowed
    await gate.release(c)
    assert await gate.try_acquire(d)


async def test_resize_up_admits_a_waiter() -> None:
    gate = LocalGate(2)
    a, b, c = object(), object(), object()
    await gate.acquire(a)
    await gate.acquire(b)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.acquire, c)
        await trio.testing.wait_all_tasks_blocked()
        assert gate.statistics() == GateStats(in_flight=2, waiting=1, max_inflight=2)
        gate.resize(3)
    assert gate.statistics() == GateStats(in_flight=3, waiting=0, max_inflight=3)


async def test_try_acquire_on_a_full_gate_is_false() -> None:
    gate = LocalGate(2)
    a, b, c = object(), object(), object()
    assert gate.try_acquire_nowait(a)
    assert await gate.try_acquire(b)
    assert not gate.try_acquire_nowait(c)
    assert not await gate.try_acquire(c)
    assert gate.statistics() == GateStats(in_flight=2, waiting=0, max_inflight=2)


async def test_try_acquire_under_cancellation_takes_nothing() -> None:
    gate = LocalGate(1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await gate.try_acquire(object())
    assert scope.cancelled_caught
    assert gate.statistics().in_flight == 0


async def test_release_frees_the_slot_for_a_waiter(autojump_clock: trio.testing.MockClock) -> None:
    gate = LocalGate(1)
    first, second = object(), object()
    granted_at: list[float] = []

    async def wait_for_slot() -> None:
        await gate.acquire(second)
        granted_at.append(trio.current_time())

    await gate.acquire(first)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_slot)
        await trio.sleep(3.0)
        assert granted_at == []
        released_at = trio.current_time()
        await gate.release(first)
    assert granted_at == [released_at]
    assert gate.statistics().in_flight == 1
    await gate.release(second)
    assert gate.statistics().in_flight == 0


async def test_release_in_a_cancelled_scope_frees_the_slot_and_does_not_raise() -> None:
    gate = LocalGate(1)
    me = object()
    await gate.acquire(me)
    with trio.CancelScope() as scope:
        scope.cancel()
        await gate.release(me)
        await gate.release(me)  # twice, or never held: a no-op
        await gate.release(object())
    assert not scope.cancelled_caught
    assert gate.statistics().in_flight == 0
