"""The gates' waiting order (capacity/priority.py): lower rank first, FIFO within a rank, the
aging bound the router's ranks give, and a queue left consistent by cancelled waiters."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from trio_gateway.capacity.gate import LocalGate
from trio_gateway.capacity.priority import PriorityLimiter
from trio_gateway.dispatch.router import queue_rank

HOLD_S = 1.0


async def _serve_in_order(
    limiter: PriorityLimiter,
    arrivals: list[tuple[str, float]],
    *,
    cancel: frozenset[str] = frozenset(),
) -> list[str]:
    """Hold the one slot, queue ``arrivals`` (name, rank) one after the other, cancel those in
    ``cancel``, then let go: the order the rest got the slot in."""
    served: list[str] = []
    holder = object()
    limiter.acquire_on_behalf_of_nowait(holder)
    scopes: dict[str, trio.CancelScope] = {}

    async def wait(name: str, rank: float) -> None:
        with trio.CancelScope() as scope:
            scopes[name] = scope
            me = object()
            await limiter.acquire_on_behalf_of(me, rank)
            served.append(name)
            assert limiter.statistics().borrowed_tokens <= limiter.total_tokens
            await trio.sleep(HOLD_S)
            limiter.release_on_behalf_of(me)

    async with trio.open_nursery() as nursery:
        for name, rank in arrivals:
            nursery.start_soon(wait, name, rank)
            await trio.testing.wait_all_tasks_blocked()
        assert limiter.statistics().tasks_waiting == len(arrivals)
        for name in cancel:
            scopes[name].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert limiter.statistics().tasks_waiting == len(arrivals) - len(cancel)
        limiter.release_on_behalf_of(holder)
    stats = limiter.statistics()
    assert (stats.borrowed_tokens, stats.tasks_waiting) == (0, 0)
    return served


async def test_lower_rank_first_and_fifo_within_a_rank(
    autojump_clock: trio.testing.MockClock,
) -> None:
    arrivals = [("low1", 1.0), ("high1", 0.0), ("low2", 1.0), ("mid", 0.5), ("high2", 0.0)]
    served = await _serve_in_order(PriorityLimiter(1), arrivals)
    assert served == ["high1", "high2", "mid", "low1", "low2"]


async def test_without_ranks_it_is_first_come_first_served(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = PriorityLimiter(1)
    order: list[int] = []
    limiter.acquire_on_behalf_of_nowait("holder")

    async def wait(i: int) -> None:
        await limiter.acquire_on_behalf_of(i)
        order.append(i)
        limiter.release_on_behalf_of(i)

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(wait, i)
            await trio.sleep(0.1)  # distinct arrival times: ranks are "now"
        limiter.release_on_behalf_of("holder")
    assert order == [0, 1, 2, 3, 4]


async def test_cancelled_waiters_leave_the_queue_and_the_rest_keep_their_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rng = random.Random(30)
    # Far more cancelled than live waiters: the heap is compacted on the way.
    arrivals = [(f"w{i}", float(rng.randrange(3))) for i in range(120)]
    cancel = frozenset(name for name, _ in arrivals if rng.random() < 0.8)
    served = await _serve_in_order(PriorityLimiter(1), arrivals, cancel=cancel)
    expected = [n for n, _ in sorted(arrivals, key=lambda a: a[1]) if n not in cancel]
    assert served == expected


async def test_concurrent_arrivals_and_cancellations_with_several_slots(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Waiters arrive, leave and are served all the time, on 3 slots: never more than 3 held,
    no grant while a waiter of a lower (rank, arrival) waits, and nothing is left behind."""
    rng = random.Random(7)
    limiter = PriorityLimiter(3)
    # Per waiter: its (rank, arrival), when it queued, when it left (served or gone), served.
    seen: list[tuple[tuple[float, int], float, float, bool]] = []

    async def client(i: int) -> None:
        await trio.sleep(rng.random() * 5)
        rank = trio.current_time() + rng.randrange(4) * 0.5
        me = object()
        queued = trio.current_time()
        served = False
        with trio.move_on_after(rng.random() * 3):
            try:
                await limiter.acquire_on_behalf_of(me, rank)
                served = True
            finally:
                seen.append(((rank, i), queued, trio.current_time(), served))
        if served:
            assert limiter.statistics().borrowed_tokens <= 3
            await trio.sleep(rng.random())
            limiter.release_on_behalf_of(me)

    async with trio.open_nursery() as nursery:
        for i in range(200):
            nursery.start_soon(client, i)
    stats = limiter.statistics()
    assert (stats.borrowed_tokens, stats.tasks_waiting) == (0, 0)
    grants = [(key, at) for key, _, at, served in seen if served]
    assert 20 < len(grants) < 180  # some were served, some gave up
    # Time stands still between a hand-over and the grantee running (the clock jumps only
    # when every task waits): strict comparisons leave out what happened in one instant.
    for key, at in grants:
        for other, queued, left, _ in seen:
            assert not (other < key and queued < at < left), (key, other)


async def test_aging_bounds_how_long_a_low_class_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A priority-1 request waits behind priority-0 ones arriving up to ``aging_s`` after it,
    never behind one arriving later, however busy the gate stays with priority 0."""
    aging_s = 2.0
    limiter = PriorityLimiter(1)
    served: list[tuple[str, float]] = []  # (name, its arrival)

    async def request(name: str, priority: int) -> None:
        arrived = trio.current_time()
        me = object()
        await limiter.acquire_on_behalf_of(me, queue_rank(arrived, priority, aging_s))
        served.append((name, arrived))
        await trio.sleep(0.3)  # slower than arrivals: the queue of highs only grows
        limiter.release_on_behalf_of(me)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(request, "first-high", 0)
        await trio.sleep(0.05)
        nursery.start_soon(request, "low", 1)
        for i in range(60):
            await trio.sleep(0.1)
            nursery.start_soon(request, f"high{i}", 0)
    low_at = [name for name, _ in served].index("low")
    ahead = served[1:low_at]
    low_arrived = 0.05
    assert ahead, "highs arriving within the aging window go first"
    assert all(arrived < low_arrived + aging_s for _, arrived in ahead)
    assert all(arrived > low_arrived + aging_s for _, arrived in served[low_at + 1 :])


async def test_a_grant_and_a_cancel_in_one_instant_keep_the_slot_accounted() -> None:
    """A waiter handed the slot and cancelled before it ran keeps the slot (its acquire
    returned); the limiter counts it, and its release frees it."""
    limiter = PriorityLimiter(1)
    limiter.acquire_on_behalf_of_nowait("holder")
    got: list[bool] = []
    async with trio.open_nursery() as nursery:

        async def wait() -> None:
            with trio.CancelScope() as scope:
                scopes.append(scope)
                await limiter.acquire_on_behalf_of("waiter", 0.0)
                got.append(True)
            limiter.release_on_behalf_of("waiter")

        scopes: list[trio.CancelScope] = []
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        limiter.release_on_behalf_of("holder")  # hands the slot over...
        scopes[0].cancel()  # ...and the waiter is cancelled in the same instant
    assert got == [True]
    assert limiter.statistics() == limiter.statistics().__class__(0, 0, 1)


async def test_nowait_never_jumps_the_queue_and_a_resize_hands_slots_over_in_order() -> None:
    limiter = PriorityLimiter(1)
    limiter.acquire_on_behalf_of_nowait("holder")
    order: list[str] = []

    async def wait(name: str, rank: float) -> None:
        await limiter.acquire_on_behalf_of(name, rank)
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "low", 5.0)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wait, "high", -5.0)
        await trio.testing.wait_all_tasks_blocked()
        limiter.total_tokens = 2  # one slot more: to the best waiter
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["high"]
        with pytest.raises(trio.WouldBlock):
            limiter.acquire_on_behalf_of_nowait("newcomer")  # "low" waits: no jumping it
        limiter.total_tokens = 3
    assert order == ["high", "low"]
    with pytest.raises(RuntimeError):
        limiter.release_on_behalf_of("nobody")


async def test_local_gate_passes_the_rank_through(autojump_clock: trio.testing.MockClock) -> None:
    gate = LocalGate(1)
    assert gate.try_acquire_nowait("holder")
    order: list[str] = []

    async def wait(name: str, rank: float) -> None:
        await gate.acquire(name, rank)
        order.append(name)
        await gate.release(name)

    async with trio.open_nursery() as nursery:
        for name, rank in (("b", 2.0), ("a", 1.0), ("c", 3.0)):
            nursery.start_soon(wait, name, rank)
            await trio.testing.wait_all_tasks_blocked()
        assert gate.statistics().waiting == 3
        await gate.release("holder")
    assert order == ["a", "b", "c"]
