"""Graceful shutdown: keep listening while answers finish within the drain (readyz says
draining, new requests get 503), then end the rest cleanly (upstream closed, an in-band
shutting_down error, a proper end of stream) and close the listener."""

from __future__ import annotations

import json
import random
from functools import partial

import httpx
import pytest
import trio

from tests.e2e.harness import Stack, chat, gateway_config, provider_toml, running_sim, script
from trio_gateway.process.serve import GatewayHandle, serve_gateway


async def test_drain_lets_short_answers_finish_and_ends_long_ones_cleanly() -> None:
    async with running_sim() as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url), "drain_timeout_s = 3.0")
        shutdown = trio.Event()
        returned = trio.Event()
        results: dict[str, str] = {}
        async with trio.open_nursery() as nursery:

            async def serve(*, task_status: trio.TaskStatus[GatewayHandle]) -> None:
                await serve_gateway(
                    config,
                    rng=random.Random(0),
                    shutdown_trigger=shutdown.wait,
                    task_status=task_status,
                )
                returned.set()

            gateway: GatewayHandle = await nursery.start(serve)
            url = gateway.base_url + "/v1/chat/completions"
            both_started = trio.Semaphore(0)

            async def stream(name: str, tokens: int) -> None:
                body = chat(script({"text_tokens": tokens}), stream=True)
                async with (
                    httpx.AsyncClient(timeout=30) as client,
                    client.stream("POST", url, json=body) as response,
                ):
                    both_started.release()
                    results[name] = "".join([line + "\n" async for line in response.aiter_lines()])

            # ~0.05 s of tokens: well inside the drain even on a loaded machine (a 0.4 s answer
            # in a 1 s drain failed 1 run in 20 with other work on both cores).
            nursery.start_soon(stream, "short", 20)
            nursery.start_soon(stream, "long", 50_000)  # ~100 s
            await both_started.acquire()
            await both_started.acquire()
            shutdown.set()
            stopping_at = trio.current_time()
            # While the long answer drains, the listener stays open and says so.
            base = gateway.base_url
            async with httpx.AsyncClient(timeout=5) as client:
                ready = await client.get(base + "/readyz")
                assert (ready.status_code, ready.json()["status"]) == (503, "draining")
                assert (await client.get(base + "/healthz")).status_code == 200
                metrics = await client.get(base + "/metrics")
                assert metrics.status_code == 200
                assert "gateway_requests_total" in metrics.text
                refused = await client.post(url, json=chat())
                assert refused.status_code == 503
                assert refused.json()["error"]["code"] == "shutting_down"
                assert refused.headers["retry-after"] == "1"
            assert not returned.is_set()
            with trio.fail_after(10):
                await returned.wait()
            took = trio.current_time() - stopping_at
            # New connections are refused once the drain is over.
            with pytest.raises(httpx.ConnectError):
                async with httpx.AsyncClient() as client:
                    await client.post(url, json=chat())

        assert 3.0 <= took < 6.0
        short = [line for line in results["short"].split("\n") if line.startswith("data: ")]
        assert short[-1] == "data: [DONE]"
        assert '"finish_reason":"stop"' in short[-2]
        long_ = [line for line in results["long"].split("\n") if line.startswith("data: ")]
        assert long_[-1] == "data: [DONE]"
        assert json.loads(long_[-2][len("data: ") :])["error"]["code"] == "shutting_down"
        stats = sim.engine.stats()
        assert stats.aborts == 1
        assert stats.tokens_generated < 50_000


async def test_new_requests_on_open_connections_are_refused_while_draining(stack: Stack) -> None:
    stack.gateway.router.drain.begin()
    async with httpx.AsyncClient() as client:
        response = await client.post(stack.v1 + "/chat/completions", json=chat())
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "shutting_down"
    assert stack.sim.engine.stats().requests == 0


async def test_a_drain_with_nothing_running_closes_the_listener_at_once() -> None:
    async with running_sim() as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url), "drain_timeout_s = 30.0")
        shutdown = trio.Event()
        async with trio.open_nursery() as nursery:
            gateway: GatewayHandle = await nursery.start(
                partial(serve_gateway, config, shutdown_trigger=shutdown.wait)
            )
            async with httpx.AsyncClient(timeout=5) as client:
                assert (await client.get(gateway.base_url + "/readyz")).status_code == 200
            shutdown.set()
            # Nothing to wait for: far sooner than the 30 s drain.
            with trio.fail_after(5):
                await gateway.router.drain.idle()
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient() as client:
                await client.get(gateway.base_url + "/healthz")
