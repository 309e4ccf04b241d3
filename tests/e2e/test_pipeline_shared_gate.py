"""The request path's take and give-back of a slot on a gate shared through a real Redis: the
slot is the borrower's, so giving it back frees it for the next request (in mutmut's
selection: pipeline's shared-gate branch has no other test there)."""

from __future__ import annotations

from tests.redis_server import running_redis
from trio_gateway.capacity.gate import LeaseBroker
from trio_gateway.dispatch.router import _give_back, _try_take
from trio_gateway.redis.client import open_redis


async def test_a_slot_taken_by_one_request_and_given_back_is_free_for_the_next() -> None:
    async with running_redis() as server, open_redis(server.url) as client:
        broker = LeaseBroker(
            client,
            key_prefix="t:",
            lease_ttl_s=5.0,
            timeout_s=2.0,
            on_error="refuse",
            process_id="p0",
        )
        gate = broker.gate("vllm", 1)
        first, second = object(), object()
        assert await _try_take(gate, first, 0)
        assert not await _try_take(gate, second, 0)  # one slot, held
        await _give_back(gate, first)
        assert await _try_take(gate, second, 0)
        await _give_back(gate, second)
        assert gate.statistics().in_flight == 0
