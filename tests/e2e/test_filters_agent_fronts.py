"""Output filters on the agent fronts (``/v1/messages``, ``/v1/responses``): the same relay
hook as chat's (dispatch/relay.py), so a word the simulator streams in pieces, cut inside its
characters too, never reaches a Messages or Responses client; a ``block`` ends the answer in
the front's own words and aborts the upstream."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai

from tests.e2e.harness import Stack
from tests.e2e.test_cancellation import wait_for_abort
from tests.e2e.test_filters import MASKED_TEXT, SECRET_TEXT, TIMEOUT_S, matches, said, stack

__all__ = ["stack"]  # the fixture, shared with test_filters.py


def sse_events(body: str) -> list[tuple[str, Any]]:
    """(event name, decoded data) of each SSE event of a body."""
    events = []
    for block in body.split("\n\n"):
        name, data = "", None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
        if data is not None:
            events.append((name, data))
    return events


def assert_prefixes(pieces: list[str], whole: str) -> None:
    so_far = ""
    for piece in pieces:
        so_far += piece
        # Every moment: a prefix of the masked answer (no piece of a word ever went out).
        assert whole.startswith(so_far.strip()) or not so_far.strip(), so_far
    assert so_far.strip() == whole


async def test_messages_stream_masks_a_word_split_across_chunks(stack: Stack) -> None:
    body = {
        "model": "agent-lite",
        "max_tokens": 200,
        "stream": True,
        "messages": [{"role": "user", "content": said(SECRET_TEXT)}],
    }
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.post(stack.v1 + "/messages", json=body)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    texts = [
        data["delta"]["text"]
        for name, data in events
        if name == "content_block_delta" and data["delta"]["type"] == "text_delta"
    ]
    assert_prefixes(texts, MASKED_TEXT)
    assert events[-1][0] == "message_stop"
    assert matches(stack, "secrets", "mask") == 2


async def test_messages_whole_through_the_sdk_is_masked(stack: Stack) -> None:
    client = anthropic.AsyncAnthropic(
        base_url=stack.v1.removesuffix("/v1"), api_key="none", max_retries=0
    )
    message = await client.messages.create(
        model="agent-lite",
        max_tokens=200,
        messages=[{"role": "user", "content": said(SECRET_TEXT)}],
    )
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text.strip() == MASKED_TEXT


async def test_messages_block_ends_with_an_error_event_and_aborts_upstream(
    stack: Stack,
) -> None:
    content = said("Safe start then forbidden-word" + " and then " + "more words " * 200)
    body = {
        "model": "agent-lite",
        "max_tokens": 2000,
        "stream": True,
        "messages": [{"role": "user", "content": content}],
    }
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.post(stack.v1 + "/messages", json=body)
    assert response.status_code == 200
    assert "forbid" not in response.text
    events = sse_events(response.text)
    texts = "".join(
        data["delta"]["text"]
        for name, data in events
        if name == "content_block_delta" and data["delta"]["type"] == "text_delta"
    )
    assert texts.strip() == "Safe start then"
    name, error = events[-1]
    assert name == "error"
    assert error["type"] == "error"
    assert error == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "the answer was stopped by the output filter 'stop'",
        },
    }
    await wait_for_abort(stack.sim)
    assert stack.sim.engine.stats().tokens_generated < 100


async def test_responses_stream_and_whole_are_masked(stack: Stack) -> None:
    body = {"model": "agent-lite", "input": said(SECRET_TEXT), "stream": True, "store": False}
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.post(stack.v1 + "/responses", json=body)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
    assert_prefixes(deltas, MASKED_TEXT)
    assert events[-1][0] == "response.completed"
    sdk = openai.AsyncOpenAI(base_url=stack.v1, api_key="none", max_retries=0)
    whole = await sdk.responses.create(model="agent-lite", input=said(SECRET_TEXT), store=False)
    assert whole.output_text.strip() == MASKED_TEXT
    assert matches(stack, "secrets", "mask") == 4
