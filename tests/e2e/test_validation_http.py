"""Bad input gets a clear error and loses nothing: a body OpenAI would refuse is refused at the
front, over HTTP (raw and through the official SDK) and over the WebSocket, naming the exact
``param``, and the simulator behind the gateway never hears of it."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import trio
import trio_websocket
from openai import AsyncOpenAI

from tests.e2e.harness import Stack, answer_text, chat, script
from tests.e2e.test_ws import TIMEOUT_S, receive, send, ws_url

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
IMAGE = {"type": "image_url", "image_url": {"url": "ftp://example.com/cat.png"}}


def deep_schema(wraps: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(wraps):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


BAD_BODIES: list[Any] = [
    ({**chat(), "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    (
        {**chat(), "messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]},
        "messages[0].content[0].type",
    ),
    (
        {**chat(), "messages": [{"role": "user", "content": [IMAGE]}]},
        "messages[0].content[0].image_url.url",
    ),
    ({**chat(), "messages": [{"role": "tool", "content": "sunny"}]}, "messages[0].tool_call_id"),
    (chat(temperature=3), "temperature"),
    (chat(max_tokens=True), "max_tokens"),
    (chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    (
        chat(tools=[{"type": "function", "function": {"name": "get weather"}}]),
        "tools[0].function.name",
    ),
    (chat(tool_choice="required"), "tool_choice"),
    (
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
        "tool_choice.function.name",
    ),
    (chat(stream_options={"include_usage": True}), "stream_options"),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": []}}),
        "response_format.json_schema.schema",
    ),
    (
        chat(
            tools=[{"type": "function", "function": {"name": "f", "parameters": deep_schema(40)}}]
        ),
        "tools[0].function.parameters" + ".properties.x" * 30,
    ),
]


async def assert_nothing_reached_the_simulator(stack: Stack) -> None:
    assert stack.sim.engine.stats().requests == 0
    assert (await stack.sim_stats())["requests"] == 0


async def test_bad_bodies_are_400_naming_the_param_and_nothing_goes_upstream(
    stack: Stack,
) -> None:
    async with httpx.AsyncClient() as client:
        for body, param in BAD_BODIES:
            for stream in (False, True):
                sent = {**body, "stream": True} if stream else body
                if stream and "stream_options" in body:
                    continue  # with stream on, that body is valid
                response = await client.post(stack.v1 + "/chat/completions", json=sent)
                assert response.status_code == 400, (param, response.text)
                assert response.headers["content-type"] == "application/json"
                error = response.json()["error"]
                assert error["code"] == "invalid_request"
                assert error["type"] == "invalid_request_error"
                assert error["param"] == param
                # Either the message names the path, or it is an enum's "Invalid value: 'x'.
                # Supported values are: ..." (OpenAI's wording, with the path in param only).
                message = error["message"]
                assert f"'{param}'" in message or message.startswith("Invalid value: "), message
        await assert_nothing_reached_the_simulator(stack)
        # The gateway is none the worse: the next good request is answered.
        response = await client.post(
            stack.v1 + "/chat/completions", json=chat(script({"text": "still fine"}))
        )
    assert answer_text(response.text, stream=False) == "still fine"


async def test_unknown_vllm_fields_pass_through_to_the_provider(stack: Stack) -> None:
    extensions = {
        "top_k": 20,
        "repetition_penalty": 1.05,
        "min_tokens": 1,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    async with httpx.AsyncClient() as client:
        response = await client.post(
            stack.v1 + "/chat/completions", json=chat(script({"text": "ok"}), **extensions)
        )
    assert response.status_code == 200, response.text
    sent = stack.sim.engine.stats().last_request_body
    assert {key: sent[key] for key in extensions} == extensions


async def test_the_openai_sdk_raises_bad_request_with_the_param(stack: Stack) -> None:
    client = AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    calls: list[tuple[dict[str, Any], str]] = [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "temperature": 2.5},
            "temperature",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"},
            "tool_choice",
        ),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [TOOL, TOOL],
            },
            "tools[1].function.name",
        ),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "stream_options": {"include_usage": True},
            },
            "stream_options",
        ),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "a b"}},
            },
            "response_format.json_schema.name",
        ),
    ]
    for fields, param in calls:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="agent-lite", **fields)
        assert info.value.status_code == 400
        assert info.value.param == param
        assert info.value.code == "invalid_request"
        assert isinstance(info.value.body, dict)
        assert info.value.body["type"] == "invalid_request_error"
        assert info.value.body["param"] == param
    # Streaming: the SDK raises before it returns a stream, as the error is an HTTP status.
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model="agent-lite",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_body={"top_p": 7},
        )
    assert info.value.param == "top_p"
    await client.close()
    await assert_nothing_reached_the_simulator(stack)


async def test_the_websocket_front_answers_an_error_event_with_the_param(stack: Stack) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio_websocket.open_websocket_url(ws_url(stack)) as ws:
            for i, (body, param) in enumerate(BAD_BODIES):
                await send(ws, {"type": "request", "id": f"bad{i}", "body": body})
                reply = await receive(ws)
                assert reply["type"] == "error"
                assert (reply["id"], reply["code"], reply["param"]) == (
                    f"bad{i}",
                    "invalid_request",
                    param,
                )
                assert reply["retryable"] is False
            await assert_nothing_reached_the_simulator(stack)
            # The socket stays open and serves the next request.
            await send(ws, {"type": "request", "id": "ok", "body": chat(script({"text": "hi"}))})
            events: list[dict[str, Any]] = []
            while not events or events[-1]["type"] not in ("response.done", "error"):
                events.append(await receive(ws))
    assert events[-1]["type"] == "response.done"
    assert "".join(e["text"] for e in events if e["type"] == "text.delta") == "hi"
