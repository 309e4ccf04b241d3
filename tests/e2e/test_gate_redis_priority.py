"""A leased gate's waiters in priority order: when another process holds every lease, the next
lease freed goes to this process's best-ranked waiter, whichever polled first, and a newcomer
does not take it ahead of them (a real Redis; capacity/gate.py)."""

from __future__ import annotations

import trio

from tests.e2e.test_gate_redis import PATIENT_TIMEOUT_S, brokers
from tests.redis_server import running_redis


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
