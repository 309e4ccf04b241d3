"""What a caller sees for every kind of failure: one vocabulary, OpenAI's shape, no tracebacks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import trio

from tests.e2e.harness import (
    Stack,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)
from trio_gateway.fronts.app import ROUTES


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert {"message", "type", "code", "param"} <= set(error)
    assert "Traceback" not in response.text
    return error


async def post(stack: Stack, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(stack.v1 + "/chat/completions", **kwargs)


async def test_malformed_json_is_400_with_the_reason(stack: Stack) -> None:
    response = await post(stack, content=b'{"model": "agent-lite", "messages": [}')
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_json"
    assert "line 1 column" in error["message"]
    assert stack.sim.engine.stats().requests == 0


async def test_invalid_fields_are_400_naming_the_param(stack: Stack) -> None:
    response = await post(stack, json=chat("x", max_tokens="10"))
    assert response.status_code == 400
    assert error_of(response)["param"] == "max_tokens"


async def test_unknown_alias_is_404_listing_the_aliases(stack: Stack) -> None:
    response = await post(stack, json={**chat("x"), "model": "gpt-17"})
    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "model_not_found"
    assert "agent-lite" in error["message"]


async def test_body_over_the_limit_is_413(stack: Stack) -> None:
    big = "x" * (4 * 1024 * 1024 + 10)
    response = await post(stack, json=chat(big))
    assert response.status_code == 413
    error = error_of(response)
    assert error["code"] == "body_too_large"
    length = len(response.request.content)
    assert error["message"] == (
        f"request body of {length} bytes is larger than server.max_body_bytes (4194304 bytes)"
    )
    assert stack.sim.engine.stats().requests == 0


async def test_a_chunked_body_over_the_limit_is_413_naming_the_setting(stack: Stack) -> None:
    async def pieces() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b" " * (1024 * 1024)

    async with httpx.AsyncClient() as client:
        response = await client.post(stack.v1 + "/chat/completions", content=pieces())
    assert response.status_code == 413
    assert error_of(response)["message"] == (
        "request body is larger than server.max_body_bytes (4194304 bytes)"
    )


async def test_missing_capability_is_400_and_nothing_goes_upstream(stack: Stack) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"model": "agent-lite", "messages": [{"role": "user", "content": [image]}]}
    response = await post(stack, json=body)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "capability_unavailable"
    assert "vision" in error["message"]
    assert stack.sim.engine.stats().requests == 0


async def test_context_length_becomes_context_length_exceeded(stack: Stack) -> None:
    long_prompt = "word " * 5000  # the simulator's max_model_len is 4096
    for stream in (False, True):
        response = await post(stack, json=chat(long_prompt, stream=stream))
        assert response.status_code == 400
        error = error_of(response)
        assert error["code"] == "context_length_exceeded"
        assert error["provider"] == "sim-a"


async def test_unknown_route_and_wrong_method() -> None:
    async with running_sim() as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url))
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            missing = await client.get(gateway.base_url + "/v2/nothing")
            wrong = await client.get(gateway.base_url + "/v1/chat/completions")
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
    # The hint lists every route, those of ROUTES included.
    for route, methods in ROUTES.items():
        assert f"{methods[0]} {route}" in error_of(missing)["message"]
    assert "GET /v1/models/{id}" in error_of(missing)["message"]
    assert "/v1/ws" in error_of(missing)["message"]
    assert wrong.status_code == 405 and error_of(wrong)["code"] == "method_not_allowed"


async def free_port_url() -> str:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


async def test_unreachable_upstream_is_502_naming_the_provider() -> None:
    config = gateway_config(provider_toml("dead-vllm", await free_port_url()))
    async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
        for stream in (False, True):
            response = await client.post(
                gateway.base_url + "/v1/chat/completions", json=chat("x", stream=stream)
            )
            assert response.status_code == 502
            error = error_of(response)
            assert error["code"] == "upstream_unreachable"
            assert "dead-vllm" in error["message"]
            assert error["provider"] == "dead-vllm"


async def test_wrong_upstream_key_is_502_upstream_auth_failed() -> None:
    async with running_sim() as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url, api_key_env=None))
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            response = await client.post(gateway.base_url + "/v1/chat/completions", json=chat())
    assert response.status_code == 502
    assert error_of(response)["code"] == "upstream_auth_failed"


async def test_error_after_the_first_byte_is_in_band_then_a_clean_end(stack: Stack) -> None:
    content = script({"text": "partial answer"}, {"drop": True})
    async with httpx.AsyncClient() as client:
        response = await client.post(
            stack.v1 + "/chat/completions", json=chat(content, stream=True)
        )
    assert response.status_code == 200
    payloads = [
        line[len("data: ") :] for line in response.text.split("\n") if line.startswith("data: ")
    ]
    assert payloads[-1] == "[DONE]"
    last = json.loads(payloads[-2])
    assert last["error"]["code"] == "upstream_protocol_error"
    assert last["error"]["provider"] == "sim-a"
    text = "".join(json.loads(p)["choices"][0]["delta"].get("content") or "" for p in payloads[:-2])
    assert text == "partial answer"


async def test_upstream_5xx_before_streaming_is_an_http_error(stack: Stack) -> None:
    content = script({"status": 500, "body": {"error": {"message": "engine dead"}}})
    response = await post(stack, json=chat(content, stream=True))
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "upstream_error"
    assert "engine dead" in error["message"]


async def test_an_internal_error_names_its_request_in_body_header_and_log(
    stack: Stack, monkeypatch: Any, caplog: Any
) -> None:
    def broken_plan(request: object) -> None:
        raise RuntimeError("a bug in routing")

    monkeypatch.setattr(stack.gateway.router, "plan", broken_plan)
    response = await post(stack, json=chat())
    assert response.status_code == 500
    error = error_of(response)
    assert error["code"] == "internal_error"
    request_id = response.headers["x-request-id"]
    assert error["request_id"] == request_id
    assert request_id in error["message"]
    assert "a bug in routing" not in response.text
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "a bug in routing" in str(logged[0].exc_info[1])
