"""Anthropic's signed thinking, back from an OpenAI history: an assistant message's
``reasoning_details`` become the thinking blocks that open its turn, untouched, so a tool loop
keeps thinking; without them (or with another vendor's) the loop pauses thinking, as before."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.anthropic_helpers import TIME_TOOL, WEATHER_TOOL, conversation_with_tools, translate
from trio_gateway.core.reasoning_details import ANTHROPIC, GOOGLE

SIGNED = {
    "type": "reasoning.text",
    "text": "Paris first.",
    "signature": "EqQBCkYIBxgC",
    "format": ANTHROPIC,
    "index": 0,
}
REDACTED = {"type": "reasoning.encrypted", "data": "EmwKAhgB", "format": ANTHROPIC, "index": 1}
THINKING_BLOCK = {"type": "thinking", "thinking": "Paris first.", "signature": "EqQBCkYIBxgC"}
REDACTED_BLOCK = {"type": "redacted_thinking", "data": "EmwKAhgB"}
ENABLED = {"type": "enabled", "budget_tokens": 4095}


def loop(details: Any, **fields: Any) -> dict[str, Any]:
    """Mid tool loop: the assistant called two tools, both answered."""
    messages = conversation_with_tools()[:4]
    if details is not None:
        messages[1] = {**messages[1], "reasoning_details": details}
    body = {"messages": messages, "tools": [WEATHER_TOOL, TIME_TOOL], "reasoning_effort": "high"}
    return body | fields


def assistant_turn(out: dict[str, Any]) -> list[dict[str, Any]]:
    turns = [m for m in out["messages"] if m["role"] == "assistant"]
    assert len(turns) == 1
    content: list[dict[str, Any]] = turns[0]["content"]
    return content


CASES: list[tuple[str, Any, Any, list[dict[str, Any]]]] = [
    # (what, reasoning_details, thinking sent, the blocks that open the assistant turn)
    ("signed thinking", [SIGNED], ENABLED, [THINKING_BLOCK]),
    ("both, in order", [SIGNED, REDACTED], ENABLED, [THINKING_BLOCK, REDACTED_BLOCK]),
    ("redacted alone", [REDACTED], ENABLED, [REDACTED_BLOCK]),
    ("no details: paused, as before", None, {"type": "disabled"}, []),
    ("empty details", [], {"type": "disabled"}, []),
    # Anthropic refuses thinking without its signature: such an entry cannot be sent.
    ("unsigned", [SIGNED | {"signature": None}], {"type": "disabled"}, []),
    ("another vendor's", [SIGNED | {"format": GOOGLE}], {"type": "disabled"}, []),
    ("no format", [SIGNED | {"format": None}], {"type": "disabled"}, []),
    ("a summary", [{"type": "reasoning.summary", "summary": "s", "format": ANTHROPIC}],
     {"type": "disabled"}, []),
]  # fmt: skip


@pytest.mark.parametrize(("what", "details", "thinking", "opening"), CASES)
def test_the_assistant_turn_opens_with_its_thinking(
    what: str, details: Any, thinking: Any, opening: list[dict[str, Any]]
) -> None:
    out = translate(loop(details))
    assert out["thinking"] == thinking, what
    content = assistant_turn(out)
    assert content[: len(opening)] == opening, what
    # Then what the assistant said and called, as before.
    rest = [block["type"] for block in content[len(opening) :]]
    assert rest == ["text", "tool_use", "tool_use"], what


def test_a_request_that_does_not_think_gets_the_history_without_them() -> None:
    # Reasoning off, or a limit too small for Anthropic's least budget.
    for fields in ({"reasoning_effort": "none"}, {"max_tokens": 1000}):
        body = loop([SIGNED, REDACTED], **fields)
        out = translate(body)
        assert out.get("thinking", {"type": "disabled"}) == {"type": "disabled"}
        assert [b["type"] for b in assistant_turn(out)] == ["text", "tool_use", "tool_use"]


def test_thinking_on_lets_the_loop_keep_its_sampling_rules() -> None:
    # With thinking kept on, what Anthropic refuses with thinking is adapted as on a first turn.
    out = translate(loop([SIGNED], temperature=0.3, tool_choice="required"))
    assert out["thinking"] == ENABLED
    assert "temperature" not in out
    assert out["tool_choice"] == {"type": "auto"}


def test_earlier_turns_keep_theirs_too() -> None:
    body = loop([SIGNED])
    body["messages"] = [
        *body["messages"],
        {"role": "assistant", "content": "Sunny.", "reasoning_details": [REDACTED]},
        {"role": "user", "content": "And Lyon?"},
    ]
    out = translate(body)
    assert out["thinking"] == ENABLED
    turns = [m["content"] for m in out["messages"] if m["role"] == "assistant"]
    assert [turn[0] for turn in turns] == [THINKING_BLOCK, REDACTED_BLOCK]


# --- the answer's side: bounds -------------------------------------------------------------------


def test_what_the_parser_keeps_of_thinking_is_bounded() -> None:
    from trio_gateway.core.errors import UpstreamProtocolError
    from trio_gateway.core.reasoning_details import MAX_DETAILS
    from trio_gateway.providers.anthropic.dialect import MAX_THINKING_CHARS, AnthropicStreamParser

    parser = AnthropicStreamParser("a")
    parser.handle({"type": "message_start", "message": {"usage": {}}})
    with pytest.raises(UpstreamProtocolError, match="thinking blocks"):
        for i in range(MAX_DETAILS + 1):
            block = {"type": "redacted_thinking", "data": "x"}
            parser.handle({"type": "content_block_start", "index": i, "content_block": block})
            parser.handle({"type": "content_block_stop", "index": i})
    parser = AnthropicStreamParser("a")
    parser.handle({"type": "message_start", "message": {"usage": {}}})
    block = {"type": "thinking", "thinking": "x" * MAX_THINKING_CHARS}
    parser.handle({"type": "content_block_start", "index": 0, "content_block": block})
    delta = {"type": "thinking_delta", "thinking": "y"}
    with pytest.raises(UpstreamProtocolError, match="thinking block of more than"):
        parser.handle({"type": "content_block_delta", "index": 0, "delta": delta})


def test_an_unsigned_thinking_block_is_not_offered_back() -> None:
    from trio_gateway.core.events import ReasoningDetail
    from trio_gateway.providers.anthropic.dialect import AnthropicStreamParser

    parser = AnthropicStreamParser("a")
    parser.handle({"type": "message_start", "message": {"usage": {}}})
    block = {"type": "thinking", "thinking": "hm", "signature": ""}
    events = parser.handle({"type": "content_block_start", "index": 0, "content_block": block})
    events += parser.handle({"type": "content_block_stop", "index": 0})
    assert not [e for e in events if isinstance(e, ReasoningDetail)]
