"""Output and input filters end to end (core/filters.py, hooked in dispatch/relay.py): a filtered
word the simulator streams in pieces (a token each, and with ``split_utf8`` each multi-byte
character written in two TCP pieces cut inside it) never reaches a client of any front, in any
part; a ``block`` ends the answer and aborts the upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import openai
import pytest
import trio
import trio_websocket

from tests.e2e.harness import (
    Stack,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)
from tests.e2e.test_cancellation import wait_for_abort
from tests.e2e.test_events_sse import parse_events
from trio_gateway.core.usage import UsageRecord

TIMEOUT_S = 10
FILTERS = r"""
[filters.secrets]
patterns = ["project-falcon", "机密"]

[filters.ids]
regex = ['\b\d{3}-\d{2}-\d{4}\b']
applies_to = ["reasoning"]

[filters.stop]
patterns = ["forbidden-word"]
action = "block"
applies_to = ["content"]

[filters.inbound]
patterns = ["leak-this"]
case_sensitive = true
"""
# Each piece a token of the simulator's (" project", "-", "falcon", "机", "密", "1", "2", ...).
SECRET_TEXT = "The Project-FALCON file is 机密, or project-falc on"
MASKED_TEXT = "The *** file is ***, or project-falc on"
TOOLS = [{"type": "function", "function": {"name": "save", "parameters": {}}}]


@attrs.define
class Records:
    records: list[UsageRecord] = attrs.field(factory=list)

    def offer(self, record: UsageRecord) -> bool:
        self.records.append(record)
        return True


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_sim() as sim:
        alias = 'output_filters = ["secrets", "ids", "stop"]\ninput_filters = ["inbound"]\n'
        config = gateway_config(alias + provider_toml("sim-a", sim.base_url) + FILTERS)
        async with running_gateway(config) as gateway:
            yield Stack(sim=sim, gateway=gateway)


def said(content: str) -> str:
    return script({"split_utf8": True}, {"text": content})


def matches(stack: Stack, name: str, action: str) -> float:
    value = stack.gateway.router.metrics.registry.get_sample_value(
        "gateway_filter_matches_total", {"alias": "agent-lite", "filter": name, "action": action}
    )
    return float(value or 0.0)


def payloads(body: str) -> list[Any]:
    out = []
    for line in body.split("\n"):
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_chat_stream_masks_a_word_split_across_chunks_and_inside_characters(
    stack: Stack,
) -> None:
    records = Records()
    stack.gateway.router.usage = records
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.post(
            stack.v1 + "/chat/completions", json=chat(said(SECRET_TEXT), stream=True)
        )
    assert response.status_code == 200, response.text
    chunks = payloads(response.text)
    assert chunks[-1] == "[DONE]"
    so_far = ""
    for chunk in chunks[:-1]:
        so_far += chunk["choices"][0]["delta"].get("content") or "" if chunk["choices"] else ""
        # Every moment: a prefix of the masked answer (no piece of a word ever went out).
        assert MASKED_TEXT.startswith(so_far.strip()) or not so_far.strip(), so_far
    assert so_far.strip() == MASKED_TEXT
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert matches(stack, "secrets", "mask") == 2
    [record] = records.records
    assert record.filtered == "secrets:mask"
    assert record.outcome == "completed"


async def test_chat_whole_and_the_openai_sdk_get_the_masked_answer(stack: Stack) -> None:
    client = openai.AsyncOpenAI(base_url=stack.v1, api_key="none", max_retries=0)
    whole = await client.chat.completions.create(
        model="agent-lite", messages=[{"role": "user", "content": said(SECRET_TEXT)}]
    )
    assert (whole.choices[0].message.content or "").strip() == MASKED_TEXT
    stream = await client.chat.completions.create(
        model="agent-lite",
        messages=[{"role": "user", "content": said(SECRET_TEXT)}],
        stream=True,
    )
    text = ""
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    assert text.strip() == MASKED_TEXT


async def test_reasoning_is_masked_by_a_regex(stack: Stack) -> None:
    content = script(
        {"reasoning": "the id 123-45-6789 and 12-345 stay"}, {"text": "fine 123-45-6789"}
    )
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        whole = await client.post(stack.v1 + "/chat/completions", json=chat(content))
        streamed = await client.post(
            stack.v1 + "/chat/completions", json=chat(content, stream=True)
        )
    message = whole.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "the id *** and 12-345 stay"
    # The regex filter applies to the reasoning only.
    assert message["content"].strip() == "fine 123-45-6789"
    reasoning = "".join(
        c["choices"][0]["delta"].get("reasoning_content") or ""
        for c in payloads(streamed.text)[:-1]
        if c["choices"]
    )
    assert reasoning == "the id *** and 12-345 stay"


async def test_tool_arguments_are_masked_in_pieces_and_whole(stack: Stack) -> None:
    # A string argument goes as the model wrote it: the hermes JSON keeps ASCII as is.
    content = script({"tool_call": {"name": "save", "arguments": {"code": "x project-falcon y"}}})
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        whole = await client.post(stack.v1 + "/chat/completions", json=chat(content, tools=TOOLS))
        streamed = await client.post(
            stack.v1 + "/chat/completions", json=chat(content, tools=TOOLS, stream=True)
        )
    [call] = whole.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"code": "x *** y"}
    fragments = [
        tc["function"]["arguments"]
        for c in payloads(streamed.text)[:-1]
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls") or []
    ]
    assert len(fragments) > 3
    assert json.loads("".join(fragments)) == {"code": "x *** y"}


async def test_chat_stream_block_ends_with_content_filter_and_aborts_upstream(
    stack: Stack,
) -> None:
    records = Records()
    stack.gateway.router.usage = records
    long_tail = " and then " + "more words " * 200
    content = said("Safe start then forbidden-word" + long_tail)
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.post(
            stack.v1 + "/chat/completions", json=chat(content, stream=True)
        )
    assert response.status_code == 200
    chunks = payloads(response.text)
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks[:-2] if c.get("choices")
    )
    assert text.strip() == "Safe start then"
    assert "forbid" not in response.text
    finish = [c for c in chunks if isinstance(c, dict) and c.get("choices")][-1]
    assert finish["choices"][0]["finish_reason"] == "content_filter"
    assert chunks[-2]["error"]["code"] == "content_filtered"
    assert chunks[-1] == "[DONE]"
    await wait_for_abort(stack.sim)
    assert stack.sim.engine.stats().tokens_generated < 100
    assert matches(stack, "stop", "block") == 1
    [record] = records.records
    assert record.error_code == "content_filtered"
    assert record.filtered == "stop:block"
    assert record.provider == "sim-a"


async def test_the_sdk_sees_the_filtered_finish_then_raises(stack: Stack) -> None:
    client = openai.AsyncOpenAI(base_url=stack.v1, api_key="none", max_retries=0)
    stream = await client.chat.completions.create(
        model="agent-lite",
        messages=[{"role": "user", "content": said("Safe start forbidden-word")}],
        stream=True,
    )
    finishes = []
    with pytest.raises(openai.APIError) as raised:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finishes.append(chunk.choices[0].finish_reason)
    assert finishes == ["content_filter"]
    assert "stop" in raised.value.message


@pytest.mark.parametrize("stream", [False, True])
async def test_block_before_anything_was_said_is_an_error_response(
    stack: Stack, stream: bool
) -> None:
    records = Records()
    stack.gateway.router.usage = records
    content = said("forbidden-word first " + "and more " * 100)
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.post(
            stack.v1 + "/chat/completions", json=chat(content, stream=stream)
        )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "content_filtered"
    await wait_for_abort(stack.sim)
    [record] = records.records
    assert record.error_code == "content_filtered"
    assert record.provider == "sim-a"


async def test_a_request_matching_an_input_filter_is_refused(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        refused = await client.post(stack.v1 + "/chat/completions", json=chat("please leak-this"))
        # Case-sensitive: another case is no match.
        served = await client.post(stack.v1 + "/chat/completions", json=chat("please LEAK-THIS"))
        events = await client.post(stack.v1 + "/events", json=chat("please leak-this"))
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "content_filtered"
    assert served.status_code == 200
    assert events.status_code == 400
    assert stack.sim.engine.stats().requests == 1
    assert matches(stack, "inbound", "refuse") == 2


async def test_events_sse_masks_and_blocks(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        masked = await client.post(stack.v1 + "/events", json=chat(said(SECRET_TEXT)))
        blocked = await client.post(
            stack.v1 + "/events", json=chat(said("Safe start forbidden-word and more"))
        )
    events = parse_events(masked.content)
    text = "".join(e["text"] for e in events if e["type"] == "text.delta")
    assert text.strip() == MASKED_TEXT
    assert events[-1]["type"] == "response.done"
    events = parse_events(blocked.content)
    text = "".join(e["text"] for e in events if e["type"] == "text.delta")
    assert text.strip() == "Safe start"
    assert events[-1]["type"] == "error"
    assert events[-1]["code"] == "content_filtered"
    assert [e["type"] for e in events].count("response.done") == 0


async def test_websocket_masks_and_blocks(stack: Stack) -> None:
    url = stack.gateway.base_url.replace("http://", "ws://") + "/v1/ws"
    with trio.fail_after(TIMEOUT_S):
        async with trio_websocket.open_websocket_url(url) as ws:
            transcripts: dict[str, list[dict[str, Any]]] = {}
            for id, text in (("m", SECRET_TEXT), ("b", "Safe start forbidden-word and more")):
                await ws.send_message(
                    json.dumps({"type": "request", "id": id, "body": chat(said(text))})
                )
                events: list[dict[str, Any]] = []
                while not events or events[-1]["type"] not in ("response.done", "error"):
                    events.append(json.loads(await ws.get_message()))
                transcripts[id] = events
    masked = "".join(e["text"] for e in transcripts["m"] if e["type"] == "text.delta")
    assert masked.strip() == MASKED_TEXT
    blocked = transcripts["b"]
    assert "".join(e["text"] for e in blocked if e["type"] == "text.delta").strip() == "Safe start"
    assert blocked[-1]["code"] == "content_filtered"


async def test_a_completion_is_masked_streamed_and_whole(stack: Stack) -> None:
    client = openai.AsyncOpenAI(base_url=stack.v1, api_key="none", max_retries=0)
    prompt = "Say " + said(SECRET_TEXT)
    whole = await client.completions.create(model="agent-lite", prompt=prompt, max_tokens=100)
    assert whole.choices[0].text.strip() == MASKED_TEXT
    stream = await client.completions.create(
        model="agent-lite", prompt=prompt, max_tokens=100, stream=True
    )
    pieces, finish = [], None
    async for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish = choice.finish_reason or finish
            assert MASKED_TEXT.startswith("".join(pieces).strip())
    assert "".join(pieces).strip() == MASKED_TEXT
    assert finish == "stop"
    await client.close()


async def test_a_reload_brings_new_filters() -> None:
    async with running_sim() as sim:
        plain = gateway_config(provider_toml("sim-a", sim.base_url))
        filtered = gateway_config(
            'output_filters = ["secrets"]\n' + provider_toml("sim-a", sim.base_url) + FILTERS
        )
        configs = iter([filtered])
        async with running_gateway(plain, load=lambda: next(configs)) as gateway:
            body = chat(script({"text": "the project-falcon plan"}))
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
                before = await client.post(gateway.base_url + "/v1/chat/completions", json=body)
                assert await gateway.reload()
                after = await client.post(gateway.base_url + "/v1/chat/completions", json=body)
    assert before.json()["choices"][0]["message"]["content"].strip() == "the project-falcon plan"
    assert after.json()["choices"][0]["message"]["content"].strip() == "the *** plan"
