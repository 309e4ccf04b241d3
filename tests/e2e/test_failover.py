"""Weights and weight-0 fallbacks, over real sockets."""

from __future__ import annotations

import json

import httpx

from tests.e2e.harness import (
    answer_text,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)
from tests.e2e.test_errors_http import free_port_url


async def test_fallback_answers_when_the_primary_is_down() -> None:
    async with running_sim() as sim:
        providers = provider_toml("dead", await free_port_url(), weight=100) + provider_toml(
            "backup", sim.base_url, weight=0
        )
        async with (
            running_gateway(gateway_config(providers)) as gateway,
            httpx.AsyncClient() as client,
        ):
            for stream in (False, True):
                response = await client.post(
                    gateway.base_url + "/v1/chat/completions",
                    json=chat(script({"text": "from backup"}), stream=stream),
                )
                assert response.status_code == 200
                assert answer_text(response.text, stream=stream) == "from backup"
        assert sim.engine.stats().requests == 2


async def test_fallback_is_not_used_while_the_primary_answers() -> None:
    async with running_sim() as primary, running_sim() as backup:
        providers = provider_toml("primary", primary.base_url) + provider_toml(
            "backup", backup.base_url, weight=0
        )
        async with (
            running_gateway(gateway_config(providers)) as gateway,
            httpx.AsyncClient() as client,
        ):
            for _ in range(5):
                response = await client.post(gateway.base_url + "/v1/chat/completions", json=chat())
                assert response.status_code == 200
        assert primary.engine.stats().requests == 5
        assert backup.engine.stats().requests == 0


async def test_request_faults_do_not_fall_back() -> None:
    async with running_sim() as primary, running_sim() as backup:
        providers = provider_toml("primary", primary.base_url) + provider_toml(
            "backup", backup.base_url, weight=0
        )
        async with (
            running_gateway(gateway_config(providers)) as gateway,
            httpx.AsyncClient() as client,
        ):
            response = await client.post(
                gateway.base_url + "/v1/chat/completions", json=chat("word " * 5000)
            )
        assert response.json()["error"]["code"] == "context_length_exceeded"
        assert backup.engine.stats().requests == 0


async def test_when_every_provider_fails_the_error_lists_each() -> None:
    providers = provider_toml("a", await free_port_url()) + provider_toml(
        "b", await free_port_url(), weight=0
    )
    async with (
        running_gateway(gateway_config(providers)) as gateway,
        httpx.AsyncClient() as client,
    ):
        response = await client.post(gateway.base_url + "/v1/chat/completions", json=chat())
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "upstream_unavailable"
    assert [a["provider"] for a in error["attempts"]] == ["a", "b"]
    assert all(a["code"] == "upstream_unreachable" for a in error["attempts"])


async def test_weights_share_traffic() -> None:
    async with running_sim() as a, running_sim() as b:
        providers = provider_toml("a", a.base_url, weight=300) + provider_toml(
            "b", b.base_url, weight=100
        )
        async with (
            running_gateway(gateway_config(providers)) as gateway,
            httpx.AsyncClient() as client,
        ):
            for _ in range(40):
                await client.post(gateway.base_url + "/v1/chat/completions", json=chat())
        share = a.engine.stats().requests / 40
        assert 0.55 < share < 0.95, share
        assert a.engine.stats().requests + b.engine.stats().requests == 40


async def test_no_failover_once_the_client_has_seen_a_byte() -> None:
    """A primary that drops mid-answer, a weight-0 backup that would answer: the client gets
    the words already sent, then one error; never a second role chunk and a second answer glued
    to the first. Whole answers are not retried either: the primary had begun to answer."""
    async with running_sim() as primary, running_sim() as backup:
        providers = provider_toml("primary", primary.base_url) + provider_toml(
            "backup", backup.base_url, weight=0
        )
        dropping = script({"text": "first half"}, {"drop": True})
        async with (
            running_gateway(gateway_config(providers)) as gateway,
            httpx.AsyncClient() as client,
        ):
            streamed = await client.post(
                gateway.base_url + "/v1/chat/completions", json=chat(dropping, stream=True)
            )
        assert streamed.status_code == 200
        assert streamed.text.count('"role":"assistant"') == 1
        assert answer_text(streamed.text, stream=True) == "first half"
        payloads = [line[6:] for line in streamed.text.split("\n") if line.startswith("data: ")]
        assert payloads[-1] == "[DONE]"
        assert json.loads(payloads[-2])["error"]["code"] == "upstream_protocol_error"
        assert primary.engine.stats().requests == 1
        assert backup.engine.stats().requests == 0
