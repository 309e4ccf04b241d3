"""The alias queue's two refusals (full, and no slot in time): their messages, Retry-After and
counters, and a queue that has room again once a waiter left."""

from __future__ import annotations

import attrs
import httpx
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
from tests.e2e.test_admission import metric, scrape_when

LONG = script({"text_tokens": 5000})  # ~10 s at the fast simulator's pace: held, never finished


async def test_queue_full_and_queue_timeout_are_told_apart_and_counted() -> None:
    async with running_sim() as sim:
        base = gateway_config(provider_toml("sim-a", sim.base_url, max_inflight=1))
        alias = attrs.evolve(
            base.aliases["agent-lite"], on_saturated="queue", max_queued=1, max_queue_wait_s=0.2
        )
        async with running_gateway(attrs.evolve(base, aliases={"agent-lite": alias})) as gateway:
            url = gateway.base_url + "/v1/chat/completions"
            upstream = gateway.router.upstreams["sim-a"]
            timed_out: list[httpx.Response] = []
            async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:

                async def hold() -> None:
                    async with client.stream("POST", url, json=chat(LONG, stream=True)) as held:
                        async for _ in held.aiter_bytes():
                            pass

                async def wait_in_queue() -> None:
                    timed_out.append(await client.post(url, json=chat("hello")))

                nursery.start_soon(hold)
                await wait_until(lambda: upstream.statistics().in_flight == 1)
                nursery.start_soon(wait_in_queue)
                await wait_until(lambda: upstream.statistics().waiting == 1)
                full = await client.post(url, json=chat("hello"))
                await wait_until(lambda: len(timed_out) == 1)
                # The waiter left: the queue has its one place again.
                await wait_in_queue()
                nursery.cancel_scope.cancel()
            page = await scrape_when(
                gateway.base_url,
                lambda p: metric(p, "gateway_refusals_total", reason="queue_timeout") == 2,
            )
    assert full.status_code == 503
    assert full.json()["error"]["message"] == "alias 'agent-lite': queue full (1 waiting)"
    assert full.headers["retry-after"] == "4"  # 1 waiting + itself, 2 s each on 1 slot
    for response in timed_out:
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "overloaded"
        assert response.json()["error"]["message"] == "alias 'agent-lite': no slot within 0.2 s"
        assert response.headers["retry-after"] == "2"
    refusals = "gateway_refusals_total"
    assert metric(page, refusals, alias="agent-lite", reason="queue_full") == 1
    assert metric(page, refusals, alias="agent-lite", reason="queue_timeout") == 2
