"""The OpenAI-compatible front over real sockets: raw httpx against gateway + simulator."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.harness import Stack, chat, script


def sse_payloads(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]


async def test_non_stream_answer_uses_the_alias_and_counts_tokens(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            stack.v1 + "/chat/completions",
            json=chat(script({"text": "Bonjour Paris"}), max_tokens=50),
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "agent-lite"
    assert body["choices"][0]["message"]["content"] == "Bonjour Paris"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] >= 2
    assert response.headers["x-request-id"]
    sent = stack.sim.engine.stats().last_request_body
    assert sent["model"] == "qwen3-32b"
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


async def test_stream_headers_chunks_and_done(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            stack.v1 + "/chat/completions",
            json=chat(script({"text": "one two three"}), stream=True),
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(c["model"] == "agent-lite" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "one two three"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # The upstream was asked for usage, but this client was not: no usage chunk.
    assert all("usage" not in c for c in chunks)
    assert stack.sim.engine.stats().last_request_body["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }


async def test_usage_chunk_is_forwarded_when_asked(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            stack.v1 + "/chat/completions",
            json=chat(
                script({"text": "a b c"}), stream=True, stream_options={"include_usage": True}
            ),
        )
    chunks = [json.loads(p) for p in sse_payloads(response.text)[:-1]]
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    # Three words, and the end-of-sequence token that vLLM also counts.
    assert usage["completion_tokens"] == stack.sim.engine.stats().tokens_generated
    assert usage["completion_tokens"] >= 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


async def test_ignored_fields_are_stripped_and_reasoning_translated(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            stack.v1 + "/chat/completions",
            json=chat(
                "hi", store=True, metadata={"k": "v"}, user="u-1", reasoning_effort="none", seed=3
            ),
        )
    assert response.status_code == 200
    sent = stack.sim.engine.stats().last_request_body
    assert not {"store", "metadata", "user", "reasoning_effort"} & set(sent)
    assert sent["seed"] == 3
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}
    # Thinking off: no reasoning came back.
    assert "reasoning_content" not in response.json()["choices"][0]["message"]


async def test_reasoning_is_split_into_reasoning_content(stack: Stack) -> None:
    content = script({"reasoning": "let me think"}, {"text": "sunny"})
    async with httpx.AsyncClient() as client:
        whole = await client.post(stack.v1 + "/chat/completions", json=chat(content))
        streamed = await client.post(
            stack.v1 + "/chat/completions", json=chat(content, stream=True, reasoning=True)
        )
    message = whole.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "let me think"
    assert message["content"].strip() == "sunny"  # Qwen3 puts "\n\n" after </think>
    chunks = [json.loads(p) for p in sse_payloads(streamed.text)[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "let me think"
    assert all("reasoning" not in d for d in deltas)
    reasoning_at = max(i for i, d in enumerate(deltas) if d.get("reasoning_content"))
    content_at = min(i for i, d in enumerate(deltas) if d.get("content"))
    assert reasoning_at < content_at


async def test_tool_calls_stream_as_fragments_and_assemble_when_whole(stack: Stack) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    content = script(
        {"reasoning": "need weather"},
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris 巴黎"}}},
    )
    async with httpx.AsyncClient() as client:
        whole = await client.post(
            stack.v1 + "/chat/completions", json=chat(content, tools=tools, tool_choice="auto")
        )
        streamed = await client.post(
            stack.v1 + "/chat/completions",
            json=chat(content, tools=tools, tool_choice="auto", stream=True),
        )
    choice = whole.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris 巴黎"}
    assert call["id"]
    chunks = [json.loads(p) for p in sse_payloads(streamed.text)[:-1]]
    fragments = [tc for c in chunks for tc in (c["choices"][0]["delta"].get("tool_calls") or [])]
    assert len(fragments) > 2
    assert fragments[0]["id"] and fragments[0]["function"]["name"] == "get_weather"
    args = "".join(f["function"]["arguments"] for f in fragments)
    assert json.loads(args) == {"city": "Paris 巴黎"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_invalid_tool_arguments_are_handed_on_raw(stack: Stack) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    content = script({"tool_call": {"name": "f", "arguments": '{"city": "Par'}})
    async with httpx.AsyncClient() as client:
        response = await client.post(
            stack.v1 + "/chat/completions", json=chat(content, tools=tools)
        )
    [call] = response.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == '{"city": "Par'
    assert call["arguments_valid"] is False


@pytest.mark.parametrize("split", [False, True])
async def test_multibyte_text_survives_the_whole_path(stack: Stack, split: bool) -> None:
    """With ``split_utf8`` the simulator cuts its writes inside multi-byte characters."""
    text = "天气 晴朗 🌍🌧️ 👩‍💻 naïve \u2028 fin"
    steps: list[dict[str, Any]] = [{"split_utf8": True}] if split else []
    body = chat(script(*steps, {"text": text}), stream=True)
    async with (
        httpx.AsyncClient() as client,
        client.stream("POST", stack.v1 + "/chat/completions", json=body) as response,
    ):
        raw = b"".join([part async for part in response.aiter_raw()])
    payloads = [line[len(b"data: ") :] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    chunks: list[dict[str, Any]] = [json.loads(p) for p in payloads[:-1]]
    got = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert got == text
    assert "\ufffd" not in got


async def test_models_lists_the_aliases(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.get(stack.v1 + "/models")
    assert response.status_code == 200
    assert [m["id"] for m in response.json()["data"]] == ["agent-lite"]
