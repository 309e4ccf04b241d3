"""Reserved slots (capacity/priority.py ``Reservation``, a provider's ``reserved_slots``): the
capped class never holds more than ``total - slots``, a privileged request finds a slot while
the capped class fills the rest, and no free slot is left to wait while someone may take it."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from trio_gateway.capacity.gate import LocalGate, reservation_of
from trio_gateway.capacity.priority import NO_RESERVATION, PriorityLimiter, Reservation
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.dispatch.router import queue_rank

HIGH, LOW = 0, 1
KEEP_FOR_HIGH = Reservation(slots=2, max_priority=HIGH)


def test_a_low_request_never_takes_a_reserved_slot() -> None:
    limiter = PriorityLimiter(4, KEEP_FOR_HIGH)
    limiter.acquire_on_behalf_of_nowait("low1", LOW)
    limiter.acquire_on_behalf_of_nowait("low2", LOW)
    with pytest.raises(trio.WouldBlock):
        limiter.acquire_on_behalf_of_nowait("low3", LOW)  # 2 free, both reserved
    limiter.acquire_on_behalf_of_nowait("high1", HIGH)
    limiter.acquire_on_behalf_of_nowait("high2", HIGH)
    with pytest.raises(trio.WouldBlock):
        limiter.acquire_on_behalf_of_nowait("high3", HIGH)  # all 4 held
    stats = limiter.statistics()
    assert (stats.borrowed_tokens, stats.capped_borrowed) == (4, 2)
    # A high request leaving frees a reserved slot: still none for the low class.
    limiter.release_on_behalf_of("high1")
    with pytest.raises(trio.WouldBlock):
        limiter.acquire_on_behalf_of_nowait("low3", LOW)


def test_a_high_request_takes_a_reserved_slot_first() -> None:
    """The privileged class's slots come out of the reserved ones: while it holds no more than
    them, the low class keeps all of its ``total - slots``."""
    limiter = PriorityLimiter(4, KEEP_FOR_HIGH)
    limiter.acquire_on_behalf_of_nowait("high1", HIGH)
    limiter.acquire_on_behalf_of_nowait("low1", LOW)
    limiter.acquire_on_behalf_of_nowait("low2", LOW)  # 3 held: the low class's 2 still there
    limiter.acquire_on_behalf_of_nowait("high2", HIGH)
    # Beyond the reserved ones, a high request uses a free unreserved slot as anyone may.
    limiter.release_on_behalf_of("low1")
    limiter.acquire_on_behalf_of_nowait("high3", HIGH)
    with pytest.raises(trio.WouldBlock):
        limiter.acquire_on_behalf_of_nowait("low3", LOW)  # full
    assert limiter.statistics().capped_borrowed == 1


async def test_a_waiting_low_request_does_not_hold_up_a_high_one() -> None:
    """A low request queued first (even ranked first, as aging would) waits for an unreserved
    slot; a high one arriving later takes the reserved slot at once, on the fast path or in the
    queue."""
    limiter = PriorityLimiter(3, Reservation(1, HIGH))
    limiter.acquire_on_behalf_of_nowait("low1", LOW)
    limiter.acquire_on_behalf_of_nowait("high1", HIGH)
    limiter.acquire_on_behalf_of_nowait("low2", LOW)  # full
    order: list[str] = []

    async def wait(name: str, rank: float, priority: int) -> None:
        await limiter.acquire_on_behalf_of(name, rank, priority)
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "low3", -100.0, LOW)  # the best rank there is
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wait, "high2", 0.0, HIGH)
        await trio.testing.wait_all_tasks_blocked()
        limiter.release_on_behalf_of("high1")  # a reserved slot: the high one, not low3
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["high2"]
        limiter.release_on_behalf_of("high2")
        limiter.acquire_on_behalf_of_nowait("high3", HIGH)  # low3 waits, yet no jumping it
        limiter.release_on_behalf_of("low1")  # an unreserved slot: low3
    assert order == ["high2", "low3"]
    stats = limiter.statistics()
    assert (stats.borrowed_tokens, stats.capped_borrowed, stats.tasks_waiting) == (3, 2, 0)


async def test_when_both_classes_may_take_a_slot_the_better_rank_gets_it() -> None:
    limiter = PriorityLimiter(2, Reservation(1, HIGH))
    limiter.acquire_on_behalf_of_nowait("a", HIGH)
    limiter.acquire_on_behalf_of_nowait("b", HIGH)
    order: list[str] = []

    async def wait(name: str, rank: float, priority: int) -> None:
        await limiter.acquire_on_behalf_of(name, rank, priority)
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "aged-low", 1.0, LOW)
        nursery.start_soon(wait, "high", 2.0, HIGH)
        await trio.testing.wait_all_tasks_blocked()
        limiter.release_on_behalf_of("a")  # unreserved: both may, the aged low ranks first
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["aged-low"]
        limiter.release_on_behalf_of("b")
    assert order == ["aged-low", "high"]


async def test_concurrent_arrivals_keep_the_reservation_and_leave_no_usable_slot_idle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two classes arrive, wait (aging), give up and are served all the time on 6 slots, 2
    reserved: at every moment the low class holds at most 4, and a waiter never coexists with
    a free slot it may take; high requests never wait while fewer than 2 of them run."""
    rng = random.Random(30)
    total, reserved = 6, Reservation(2, HIGH)
    limiter = PriorityLimiter(total, reserved)
    high_running = 0
    waited_highs: list[int] = []  # highs running when a high request had to queue

    def check() -> None:
        stats = limiter.statistics()
        assert stats.borrowed_tokens <= total
        assert stats.capped_borrowed <= total - reserved.slots
        privileged_waiting = stats.tasks_waiting - stats.capped_waiting
        if privileged_waiting:
            assert stats.borrowed_tokens == total
        if stats.capped_waiting:
            assert stats.borrowed_tokens == total or stats.capped_borrowed == total - reserved.slots

    async def client(i: int) -> None:
        nonlocal high_running
        await trio.sleep(rng.random() * 20)
        priority = HIGH if rng.random() < 0.2 else LOW
        me = object()
        check()
        try:
            limiter.acquire_on_behalf_of_nowait(me, priority)
        except trio.WouldBlock:
            if priority == HIGH:
                waited_highs.append(high_running)
            with trio.move_on_after(rng.random() * 4) as scope:
                await limiter.acquire_on_behalf_of(
                    me, queue_rank(trio.current_time(), priority, 0.5), priority
                )
            check()
            if scope.cancelled_caught:
                return
        high_running += priority == HIGH
        check()
        await trio.sleep(0.5 + rng.random())
        limiter.release_on_behalf_of(me)
        high_running -= priority == HIGH
        check()

    async with trio.open_nursery() as nursery:
        for i in range(400):
            nursery.start_soon(client, i)
    stats = limiter.statistics()
    assert (stats.borrowed_tokens, stats.tasks_waiting, stats.capped_borrowed) == (0, 0, 0)
    assert all(running >= reserved.slots for running in waited_highs), waited_highs


async def test_a_resize_keeps_the_holders_and_applies_the_new_reservation() -> None:
    gate = LocalGate(4)
    for name in ("l1", "l2", "l3"):
        assert gate.try_acquire_nowait(name, LOW)
    gate.resize(4, KEEP_FOR_HIGH)  # 3 lows held, 2 allowed: they keep their slots
    assert not gate.try_acquire_nowait("l4", LOW)
    assert gate.try_acquire_nowait("h1", HIGH)
    await gate.release("l1")
    assert not gate.try_acquire_nowait("l4", LOW)  # still 2 lows held
    await gate.release("l2")
    assert gate.try_acquire_nowait("l4", LOW)
    with pytest.raises(ValueError, match="at least one slot"):
        gate.resize(2, KEEP_FOR_HIGH)
    with pytest.raises(ValueError, match="at least one slot"):
        PriorityLimiter(1, Reservation(1, HIGH))


def provider(reserved: str, max_inflight: int = 8) -> str:
    return f"""
[aliases.a]
[[aliases.a.providers]]
name = "vllm"
type = "openai_compatible"
base_url = "http://127.0.0.1:1/v1"
model = "m"
max_inflight = {max_inflight}
{reserved}
"""


def test_the_config_reads_a_reservation_and_refuses_one_without_meaning() -> None:
    config = parse_config(
        provider("reserved_slots = 6\nreserved_for_priority_at_most = 0"), source="t.toml"
    )
    p = config.aliases["a"].providers[0]
    assert (p.reserved_slots, p.reserved_for_priority_at_most) == (6, 0)
    assert reservation_of(p) == Reservation(6, 0)
    refused = {
        "reserved_slots = 8\nreserved_for_priority_at_most = 0": "must be less than max_inflight",
        "reserved_slots = 2": "needs reserved_for_priority_at_most",
        "reserved_for_priority_at_most = 0": "must be at least 1",
        "reserved_slots = 1\nreserved_for_priority_at_most = 3000000000": "must be an integer",
        "reserved_slot = 1": "reserved_slot",
    }
    for toml, problem in refused.items():
        with pytest.raises(Exception, match=problem):
            parse_config(provider(toml), source="t.toml")


def test_every_gate_holds_the_whole_reservation() -> None:
    """No process takes a share of it: a host's workers share one queue through their
    supervisor (host_slots.py), and leases hold it cluster-wide (gate.py)."""
    config = ProviderConfig(
        name="v",
        type="openai_compatible",
        base_url="http://h/v1",
        model="m",
        max_inflight=8,
        reserved_slots=3,
        reserved_for_priority_at_most=0,
    )
    assert reservation_of(config) == Reservation(3, 0)
    assert reservation_of(ProviderConfig(name="v", type="openai", model="m")) == NO_RESERVATION
