"""The `openai` dialect: OpenAI's own Chat Completions (strict fields, hidden reasoning, string
error codes), checked with the openai SDK (sync client in a worker thread)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import trio

from trio_gateway.sim import SimConfig
from trio_gateway.sim.errors import ApiError
from trio_gateway.sim.openai_wire import parse_openai_request

from .conftest import StartSim

MODEL = "gpt-sim"
KEY = "sk-test"
DEADLINE_S = 10
CONFIG = SimConfig(dialect="openai", served_model_name=MODEL, max_model_len=512)
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def scripted(*steps: Any) -> Any:
    return [{"role": "user", "content": f"go <sim>{json.dumps({'steps': list(steps)})}</sim>"}]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize(
    ("request_body", "status", "message", "code"),
    [
        (body(top_k=5), 400, "Unrecognized request argument supplied: top_k", None),
        (
            body(chat_template_kwargs={"enable_thinking": False}),
            400,
            "Unrecognized request argument supplied: chat_template_kwargs",
            None,
        ),
        (body(structured_outputs={}), 400, "Unrecognized request argument supplied", None),
        (
            body(stream=True, stream_options={"continuous_usage_stats": True}),
            400,
            "Unknown parameter: 'stream_options.continuous_usage_stats'.",
            "unknown_parameter",
        ),
        (body(reasoning_effort="max"), 400, "Invalid value: 'max'", "invalid_value"),
        (body(model="gpt-0"), 404, "The model `gpt-0` does not exist", "model_not_found"),
        (
            body(messages=[{"role": "user", "content": "w " * 600}]),
            400,
            "maximum context length is 512 tokens. However, your messages resulted in 610",
            "context_length_exceeded",
        ),
    ],
)
def test_requests_are_checked_like_openai(
    request_body: Any, status: int, message: str, code: str | None
) -> None:
    error = parse_openai_request(json.dumps(request_body).encode(), CONFIG)
    assert isinstance(error, ApiError)
    assert error.status == status
    inner = error.body["error"]
    assert message in inner["message"]
    assert inner["code"] == code and inner["type"] == "invalid_request_error"
    if code == "context_length_exceeded":
        assert inner["param"] == "messages"


def test_openai_fields_are_accepted() -> None:
    request = parse_openai_request(
        json.dumps(
            body(reasoning_effort="low", max_completion_tokens=5, verbosity="low", store=False)
        ).encode(),
        CONFIG,
    )
    assert not isinstance(request, ApiError)
    assert request.thinking and request.max_tokens == 5
    off = parse_openai_request(json.dumps(body(reasoning_effort="none")).encode(), CONFIG)
    assert not isinstance(off, ApiError) and not off.thinking


async def start(start_sim: StartSim, **fields: Any) -> Any:
    return await start_sim(dialect="openai", served_model_name=MODEL, api_key=KEY, **fields)


def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key=KEY, max_retries=0, timeout=10)


async def test_sdk_stream_hides_reasoning_and_assembles_tool_calls(start_sim: StartSim) -> None:
    sim = await start(start_sim)
    steps = (
        {"reasoning": "secret thoughts"},
        {"text": "Hi 世界"},
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Parés"}}},
    )

    def run() -> list[Any]:
        stream = sdk(sim.base_url).chat.completions.create(
            model=MODEL,
            messages=scripted(*steps),
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
        return list(stream)

    chunks = await trio.to_thread.run_sync(run)
    raw = json.dumps([c.model_dump() for c in chunks])
    assert "secret" not in raw
    assert '"reasoning":' not in raw and "token_ids" not in raw
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Hi 世界"
    arguments = "".join(
        call.function.arguments or "" for d in deltas for call in d.tool_calls or ()
    )
    assert json.loads(arguments) == {"city": "Parés"}
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    usage = chunks[-1].usage
    assert usage.completion_tokens_details.reasoning_tokens == 2
    assert usage.prompt_tokens_details.cached_tokens == 0


async def test_sdk_whole_body(start_sim: StartSim) -> None:
    sim = await start(start_sim)

    def run() -> Any:
        return sdk(sim.base_url).chat.completions.create(
            model=MODEL,
            messages=scripted({"reasoning": "x y"}, {"text": "Hello"}),
            reasoning_effort="low",
            max_completion_tokens=100,
        )

    completion = await trio.to_thread.run_sync(run)
    assert completion.choices[0].message.content == "Hello"
    assert completion.usage.completion_tokens_details.reasoning_tokens == 2
    assert completion.system_fingerprint.startswith("fp_")
    assert "reasoning" not in completion.choices[0].message.model_dump()


async def test_sdk_errors(start_sim: StartSim) -> None:
    sim = await start(start_sim)
    client = sdk(sim.base_url)

    def call(messages: Any) -> None:
        client.chat.completions.create(model=MODEL, messages=messages)

    with pytest.raises(openai.RateLimitError) as info:
        await trio.to_thread.run_sync(call, scripted({"status": 429, "retry_after": 3}))
    assert info.value.code == "rate_limit_exceeded"
    assert info.value.response.headers["retry-after"] == "3"
    with pytest.raises(openai.RateLimitError) as info:
        await trio.to_thread.run_sync(
            call, scripted({"status": 429, "error": "insufficient_quota"})
        )
    assert info.value.code == "insufficient_quota" and info.value.type == "insufficient_quota"
    with pytest.raises(openai.BadRequestError) as bad:
        await trio.to_thread.run_sync(call, [{"role": "user", "content": "w " * 5000}])
    assert bad.value.code == "context_length_exceeded"

    def wrong_key() -> None:
        other = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="nope", max_retries=0)
        other.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])

    with pytest.raises(openai.AuthenticationError) as auth:
        await trio.to_thread.run_sync(wrong_key)
    assert auth.value.code == "invalid_api_key"

    def in_stream() -> str:
        seen: list[str] = []
        failing = scripted({"text": "a b"}, {"status": 500, "in_stream": True})
        for chunk in client.chat.completions.create(model=MODEL, messages=failing, stream=True):
            if chunk.choices:
                seen.append(chunk.choices[0].delta.content or "")
        return "".join(seen)

    with pytest.raises(openai.APIError, match="The server had an error"):
        await trio.to_thread.run_sync(in_stream)


async def test_client_leaving_mid_stream_aborts(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start(start_sim)
    raw = body(stream=True, messages=scripted({"text": "first"}, {"delay_s": 60}, {"text": "x"}))
    headers = {"authorization": f"Bearer {KEY}"}
    with trio.fail_after(DEADLINE_S):
        async with client.stream(
            "POST", sim.base_url + "/v1/chat/completions", json=raw, headers=headers
        ) as r:
            async for line in r.aiter_lines():
                if "first" in line:
                    break
        stats = await sim.engine.wait_until(lambda s: s.aborts == 1 and s.running == 0)
    assert stats.disconnects == 1
