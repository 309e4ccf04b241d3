"""The Retry-After of a saturated alias is an estimate, not a constant: the queue ahead, served
at the provider's pace (2 s a request until one has finished) spread over its slots."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.e2e.harness import (
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)

LONG = script({"text_tokens": 5000})  # ~10 s at the fast simulator's pace: held, never finished


@pytest.mark.parametrize(("slots", "retry_after"), [(1, "2"), (2, "1")])
async def test_retry_after_is_the_queue_ahead_at_the_providers_pace(
    slots: int, retry_after: str
) -> None:
    async with running_sim() as sim:
        providers = provider_toml(
            "sim-a", sim.base_url, max_inflight=slots, extra="queue_timeout_s = 0.05"
        )
        async with running_gateway(gateway_config(providers)) as gateway:
            url = gateway.base_url + "/v1/chat/completions"
            upstream = gateway.router.upstreams["sim-a"]
            async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:

                async def hold() -> None:
                    async with client.stream("POST", url, json=chat(LONG, stream=True)) as held:
                        async for _ in held.aiter_bytes():
                            pass

                for _ in range(slots):
                    nursery.start_soon(hold)
                await wait_until(lambda: upstream.statistics().in_flight == slots)
                refused = await client.post(url, json=chat("hello"))
                nursery.cancel_scope.cancel()
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "overloaded"
    assert refused.headers["retry-after"] == retry_after
