"""A leased gate's waiters in priority order: when another process holds every lease, the next
lease freed goes to this process's best-ranked waiter, whichever polled first, and a newcomer
does not take it ahead of them; reserved slots hold cluster-wide (a real Redis;
capacity/gate.py)."""

from __future__ import annotations

import trio

from tests.e2e.test_gate_redis import PATIENT_TIMEOUT_S, brokers, leases_in_redis
from tests.redis_server import running_redis
from trio_gateway.capacity.priority import Reservation


async def test_the_best_ranked_waiter_gets_the_next_lease() -> None:
    async with running_redis() as server, brokers(server, 2, timeout_s=PATIENT_TIMEOUT_S) as bs:
        elsewhere, here = (b.gate("vllm", 3) for b in bs)
        held = [object(), object()]
        for borrower in held:
            assert await elsewhere.try_acquire(borrower)
        mine = object()
        assert await here.try_acquire(mine)  # the cluster's 3 leases are all taken
        served: list[str] = []
        holders: list[object] = []
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for broker in bs:  # renewals: the leases outlive their 0.6 s TTL
                    await nursery.start(broker.serve)

                async def wait(name: str, rank: float) -> None:
                    me = object()
                    await here.acquire(me, rank)
                    served.append(name)
                    holders.append(me)  # held: the next lease must come from elsewhere

                # Both hold a local slot and wait for a lease; the low one came first.
                nursery.start_soon(wait, "low", 10.0)
                await trio.sleep(0.3)
                nursery.start_soon(wait, "high", 0.0)
                await trio.sleep(0.3)
                assert here.statistics().waiting == 2
                assert not await here.try_acquire(object())  # no jumping the waiters
                # A release here wakes them at once: the high one asks Redis, the low one
                # waits its turn (before, both asked and the first woken, the low one, won).
                await here.release(mine)
                await trio.sleep(0.3)
                assert served == ["high"]
                await elsewhere.release(held[0])  # the next lease, from elsewhere: polled
                with trio.fail_after(5):
                    while len(served) < 2:  # noqa: ASYNC110 - Redis has no event to wait on
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
        for borrower in holders:
            await here.release(borrower)
        await elsewhere.release(held[1])
        assert served == ["high", "low"]
        assert here.statistics().in_flight == 0
        assert sum(b.errors for b in bs) == 0


async def test_reserved_leases_hold_cluster_wide_and_a_high_waiter_is_not_held_up() -> None:
    """3 leases, 1 reserved for priority 0: the low class holds at most 2 across both
    processes; with a low request waiting (first in rank) and a high one behind it, the
    reserved lease freed elsewhere goes to the high one, which asks Redis on its own."""
    keep = Reservation(1, 0)
    async with running_redis() as server, brokers(server, 2, timeout_s=PATIENT_TIMEOUT_S) as bs:
        elsewhere, here = (b.gate("vllm", 3, keep) for b in bs)
        low_elsewhere, high_elsewhere, low_here = object(), object(), object()
        assert await elsewhere.try_acquire(low_elsewhere, 1)
        assert await here.try_acquire(low_here, 1)
        assert not await here.try_acquire(object(), 1)  # 2 lows cluster-wide: the cap
        assert not await elsewhere.try_acquire(object(), 1)
        assert await elsewhere.try_acquire(high_elsewhere, 0)  # the reserved lease
        assert await leases_in_redis(server, "vllm") == 3
        served: list[str] = []
        holders: list[object] = []
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for broker in bs:
                    await nursery.start(broker.serve)

                async def wait(name: str, rank: float, priority: int) -> None:
                    me = object()
                    await here.acquire(me, rank, priority)
                    served.append(name)
                    holders.append(me)

                nursery.start_soon(wait, "low", -10.0, 1)
                await trio.sleep(0.3)
                nursery.start_soon(wait, "high", 0.0, 0)
                await trio.sleep(0.3)
                assert here.statistics().waiting == 2
                await elsewhere.release(high_elsewhere)  # a reserved lease, elsewhere: polled
                with trio.fail_after(5):
                    while not served:  # noqa: ASYNC110 - Redis has no event to wait on
                        await trio.sleep(0.05)
                await trio.sleep(0.5)  # the low one keeps polling, refused
                assert served == ["high"]
                await elsewhere.release(low_elsewhere)  # an unreserved one: the low waiter's
                with trio.fail_after(5):
                    while len(served) < 2:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
        assert served == ["high", "low"]
        for borrower in [*holders, low_here]:
            await here.release(borrower)
        assert await leases_in_redis(server, "vllm") == 0
        assert sum(b.errors for b in bs) == 0
