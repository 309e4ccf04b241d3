"""Anthropic's stream parser (``providers/anthropic.py``): each malformed-stream message, what
is skipped, and ``usage_so_far`` before the final count.

Written for mutation testing (docs/testing.md): the dialect tests check that a bad stream is an
``UpstreamProtocolError``; these pin the message an operator reads.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.core.errors import UpstreamProtocolError
from trio_gateway.core.events import Event, ReasoningDelta, ResponseStarted, TextDelta, Usage
from trio_gateway.core.sse import SSEEvent
from trio_gateway.core.usage import PartialUsage
from trio_gateway.providers.anthropic.dialect import AnthropicStreamParser

MALFORMED = "cl sent a malformed stream: "
START: dict[str, Any] = {"type": "message_start", "message": {"usage": {"input_tokens": 3}}}


def started(*blocks: dict[str, Any]) -> AnthropicStreamParser:
    parser = AnthropicStreamParser("cl")
    parser.handle(START)
    for index, block in enumerate(blocks):
        parser.handle({"type": "content_block_start", "index": index, "content_block": block})
    return parser


def delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": fields}


TEXT = {"type": "text", "text": ""}
THINKING = {"type": "thinking", "thinking": ""}
TOOL = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}


@pytest.mark.parametrize(
    ("blocks", "event", "what"),
    [
        ([TEXT], delta(0, type="text_delta", text=3), "a text_delta's text is not a string"),
        (
            [THINKING],
            delta(0, type="thinking_delta", thinking=3),
            "a thinking_delta's thinking is not a string",
        ),
        (
            [TOOL],
            delta(0, type="input_json_delta", partial_json=3),
            "a partial_json is not a string",
        ),
        ([TEXT], delta(0, type="thinking_delta", thinking="x"), "a thinking_delta in a text block"),
        ([THINKING], delta(0, type="text_delta", text="x"), "a text_delta in a thinking block"),
        (
            [],
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": 3},
            },
            "a text block's text is not a string",
        ),
        (
            [],
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": 3},
            },
            "a tool_use id is not a string",
        ),
        (
            [],
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "t"},
            },
            "a tool_use block without an id or a name",
        ),
        ([], {"type": "message_start", "message": {}}, "a second message_start"),
        ([], {"type": "message_stop"}, "message_stop without a stop_reason"),
    ],
)
def test_malformed_events(blocks: list[dict[str, Any]], event: dict[str, Any], what: str) -> None:
    parser = started(*blocks)
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.handle(event)
    assert caught.value.message == MALFORMED + what
    assert caught.value.provider == "cl"


@pytest.mark.parametrize("kind", ["content_block_delta", "message_delta", "message_stop"])
def test_events_before_message_start(kind: str) -> None:
    with pytest.raises(UpstreamProtocolError) as caught:
        AnthropicStreamParser("cl").handle({"type": kind})
    assert caught.value.message == MALFORMED + f"{kind} before message_start"


def test_feed_messages() -> None:
    parser = AnthropicStreamParser("cl")
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.feed(SSEEvent(data=b"[1]"))
    assert caught.value.message == MALFORMED + "an event that is not an object"
    parser = started()
    parser.handle({"type": "message_delta", "delta": {"stop_reason": "end_turn"}})
    parser.handle({"type": "message_stop"})
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.feed(SSEEvent(data=json.dumps({"type": "ping"}).encode()))
    assert caught.value.message == MALFORMED + "data after message_stop"


def test_signatures_citations_and_empty_deltas_are_skipped() -> None:
    parser = started(TEXT, THINKING)
    skipped: list[Event] = []
    skipped += parser.handle(delta(1, type="signature_delta", signature="s"))
    skipped += parser.handle(delta(0, type="citations_delta", citation={}))
    skipped += parser.handle(delta(0, type="text_delta", text=""))
    skipped += parser.handle(delta(1, type="thinking_delta", thinking=""))
    assert skipped == []
    assert parser.handle(delta(0, type="text_delta", text="ab")) == [TextDelta("ab")]
    assert parser.handle(delta(1, type="thinking_delta", thinking="cd")) == [ReasoningDelta("cd")]


def test_usage_so_far_counts_every_delta() -> None:
    parser = started(TEXT, THINKING)
    assert parser.usage_so_far() == PartialUsage(Usage(3, 0), estimated=True)
    parser.handle(delta(0, type="text_delta", text="abcdefgh"))
    parser.handle(delta(1, type="thinking_delta", thinking="ijklmnop"))
    parser.handle(delta(0, type="text_delta", text="qrst"))
    assert parser.usage_so_far() == PartialUsage(Usage(3, 5), estimated=True)


def test_a_fresh_parser() -> None:
    parser = AnthropicStreamParser("cl")
    assert not parser.done
    assert parser.usage_so_far() is None
    assert parser.handle(START) == [ResponseStarted("cl")]


@pytest.mark.parametrize(
    ("blocks", "event", "what"),
    [
        ([], {"type": "content_block_start", "index": -1}, "content_block_start with index -1"),
        (
            [],
            {"type": "content_block_start", "index": 0},
            "content_block_start without a 'content_block' object",
        ),
        (
            [],
            {"type": "content_block_stop", "index": 0},
            "content_block_stop for block 0, which is not open",
        ),
        ([], {"type": "message_delta", "delta": {"stop_reason": 3}}, "stop_reason is not a string"),
        (
            [],
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "t", "name": 3},
            },
            "a tool_use name is not a string",
        ),
        (
            [],
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": 3},
            },
            "a thinking block's thinking is not a string",
        ),
    ],
)
def test_more_malformed_events(
    blocks: list[dict[str, Any]], event: dict[str, Any], what: str
) -> None:
    with pytest.raises(UpstreamProtocolError) as caught:
        started(*blocks).handle(event)
    assert caught.value.message == MALFORMED + what


def test_a_block_stop_before_message_start() -> None:
    with pytest.raises(UpstreamProtocolError) as caught:
        AnthropicStreamParser("cl").handle({"type": "content_block_stop", "index": 0})
    assert caught.value.message == MALFORMED + "content_block_stop before message_start"


def test_the_event_name_stands_for_a_missing_type() -> None:
    parser = AnthropicStreamParser("cl")
    event = SSEEvent(event="message_start", data=b'{"message": {}}')
    assert parser.feed(event) == [ResponseStarted("cl")]


def test_usage_so_far_counts_tool_arguments() -> None:
    parser = started(TEXT, TOOL)
    parser.handle(delta(0, type="text_delta", text="abcdefgh"))
    parser.handle(delta(1, type="input_json_delta", partial_json='{"a": "bcd"}'))
    assert parser.usage_so_far() == PartialUsage(Usage(3, 5), estimated=True)
