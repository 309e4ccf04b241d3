"""Upstreams that go quiet: no first token in time, or silence mid-answer."""

from __future__ import annotations

import json

import attrs
import httpx

from tests.e2e.harness import (
    FAST_SIM,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)

TIMEOUTS = "first_token_timeout_s = 0.3\nidle_timeout_s = 0.3"


async def test_no_first_token_in_time_is_504_or_a_failover() -> None:
    # A long prefill: seconds before the first token, whatever the request.
    slow_engine = attrs.evolve(FAST_SIM, prefill_s_per_token=0.2)
    async with running_sim(slow_engine) as slow, running_sim() as backup:
        quiet = script({"text": "too late"})
        alone = gateway_config(provider_toml("slow", slow.base_url, extra=TIMEOUTS))
        async with running_gateway(alone) as gateway, httpx.AsyncClient() as client:
            response = await client.post(
                gateway.base_url + "/v1/chat/completions", json=chat(quiet, stream=True)
            )
        assert response.status_code == 504
        error = response.json()["error"]
        assert error["code"] == "upstream_timeout"
        assert "no first token within 0.3 s" in error["message"]
        # The slow upstream was let go: the simulator saw its client leave.
        await wait_until(
            lambda: slow.engine.stats().aborts == 1 and not slow.engine.stats().running
        )

        both = gateway_config(
            provider_toml("slow", slow.base_url, extra=TIMEOUTS)
            + provider_toml("backup", backup.base_url, weight=0)
        )
        async with running_gateway(both) as gateway, httpx.AsyncClient() as client:
            response = await client.post(
                gateway.base_url + "/v1/chat/completions", json=chat(quiet)
            )
        assert response.status_code == 200  # nothing had reached the client: failed over
        assert response.json()["choices"][0]["message"]["content"] == "too late"
        assert backup.engine.stats().requests == 1


async def test_silence_mid_answer_is_an_in_band_timeout() -> None:
    async with running_sim() as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url, extra=TIMEOUTS))
        stalls = script({"text": "first words"}, {"delay_s": 5}, {"text": "never sent"})
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            response = await client.post(
                gateway.base_url + "/v1/chat/completions", json=chat(stalls, stream=True)
            )
        assert response.status_code == 200
        payloads = [
            line[len("data: ") :] for line in response.text.split("\n") if line.startswith("data: ")
        ]
        assert payloads[-1] == "[DONE]"
        error = json.loads(payloads[-2])["error"]
        assert error["code"] == "upstream_timeout"
        assert "no data for 0.3 s" in error["message"]
        await wait_until(lambda: sim.engine.stats().aborts == 1)


async def test_a_served_upstream_keeps_its_streams_deadlines_in_one_task() -> None:
    # No watcher task per stream: the provider's services keep every stream's deadlines.
    async with running_sim() as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url, extra=TIMEOUTS))
        slow = script(
            {"text": "a"}, {"delay_s": 0.2}, {"text": "b"}, {"delay_s": 0.2}, {"text": "c"}
        )
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            deadlines = gateway.router.upstreams["sim-a"].read_deadlines  # type: ignore[union-attr]
            assert deadlines.running
            async with client.stream(
                "POST", gateway.base_url + "/v1/chat/completions", json=chat(slow, stream=True)
            ) as response:
                seen = []
                lines = []
                async for line in response.aiter_lines():
                    lines.append(line)
                    if line.startswith("data: {"):
                        seen.append(len(deadlines))
            # Kept while it reads; the last chunks come out after its reads have ended.
            assert seen[:3] == [1, 1, 1]
            assert len(deadlines) == 0
            assert response.status_code == 200 and "data: [DONE]" in lines
