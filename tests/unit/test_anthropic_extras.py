"""The Messages front's Anthropic-only extras (``anthropic_extras`` in the chat body): merged
into the Anthropic request on the blocks they were noted against, checked and bounded again in
the dialect (a chat client may send the field), and never sent to any other provider."""

from __future__ import annotations

import json
from typing import Any

from tests.unit.anthropic_helpers import PROVIDER, WEATHER_TOOL
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.request import validate_chat_body
from trio_gateway.fronts.messages.request import translate
from trio_gateway.providers.anthropic.dialect import AnthropicDialect
from trio_gateway.providers.anthropic.request import build_body
from trio_gateway.providers.openai_compatible.dialect import OpenAICompatibleDialect

EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
CLEAR_THINKING = {"type": "clear_thinking_20251015", "keep": "all"}
CLEAR_TOOLS = {"type": "clear_tool_uses_20250919"}


def messages_body(**fields: Any) -> dict[str, Any]:
    return {
        "model": "alias",
        "max_tokens": 2000,
        "system": [
            {"type": "text", "text": "a"},
            {"type": "text", "text": "b", "cache_control": HOUR},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": HOUR}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                    {"type": "text", "text": "and?", "cache_control": EPHEMERAL},
                ],
            },
        ],
        "tools": [
            {"name": "f", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
            {"name": "g", "input_schema": {"type": "object"}, "cache_control": EPHEMERAL},
        ],
        **fields,
    }


def anthropic_body(body: dict[str, Any], beta: str | None = None) -> dict[str, Any]:
    chat = translate(body, anthropic_beta=beta).body
    return build_body(validate_chat_body(chat), PROVIDER)


def test_breakpoints_land_on_the_blocks_they_were_on() -> None:
    sent = anthropic_body(messages_body())
    assert sent["system"] == [{"type": "text", "text": "a\n\nb", "cache_control": HOUR}]
    first, assistant, last = sent["messages"]
    assert first["content"] == [{"type": "text", "text": "hi", "cache_control": HOUR}]
    assert [b.get("cache_control") for b in assistant["content"]] == [None, None]
    # The tool result first (Anthropic's order), the user's text after it, marked.
    assert [(b["type"], b.get("cache_control")) for b in last["content"]] == [
        ("tool_result", None),
        ("text", EPHEMERAL),
    ]
    # The server tool dropped: the breakpoint on the second chat tool, "g".
    assert [(t["name"], t.get("cache_control")) for t in sent["tools"]] == [
        ("f", None),
        ("g", EPHEMERAL),
    ]


def test_context_management_service_tier_and_betas_reach_anthropic() -> None:
    body = messages_body(
        context_management={"edits": [CLEAR_THINKING, CLEAR_TOOLS]},
        service_tier="standard_only",
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "hi"}],
    )
    chat = translate(body, anthropic_beta="context-management-2025-06-27, <bad>,x").body
    request = validate_chat_body(chat)
    call = AnthropicDialect().build_call(request, PROVIDER)
    sent = json.loads(call.body)
    assert sent["context_management"] == {"edits": [CLEAR_THINKING, CLEAR_TOOLS]}
    assert sent["service_tier"] == "standard_only"
    assert call.headers["anthropic-beta"] == "context-management-2025-06-27,x"
    assert "anthropic_extras" not in sent


def test_clearing_thinking_is_left_out_of_a_request_that_does_not_think() -> None:
    # No thinking asked for (and mid tool loop without its signed thinking it would be off).
    both = anthropic_body(
        messages_body(context_management={"edits": [CLEAR_THINKING, CLEAR_TOOLS]})
    )
    assert "thinking" not in both or both["thinking"]["type"] != "enabled"
    assert both["context_management"] == {"edits": [CLEAR_TOOLS]}
    only = anthropic_body(messages_body(context_management={"edits": [CLEAR_THINKING]}))
    assert "context_management" not in only


def test_a_chat_client_s_extras_are_checked_and_bounded() -> None:
    marks = [[i, {"type": "ephemeral", "ttl": "9y", "x": 1}] for i in range(10)]
    chat: dict[str, Any] = {
        "model": "alias",
        "messages": [{"role": "user", "content": f"m{i}"} for i in range(10)],
        "tools": [WEATHER_TOOL],
        "anthropic_extras": {
            "messages": [*marks, ["0", EPHEMERAL], "junk"],
            "tools": [[0, EPHEMERAL]],
            "context_management": {"edits": ["x" * 20_000]},
            "service_tier": "priority",
            "betas": ["ok-1", 3, "NOT OK"],
            "unknown": True,
        },
    }
    request = validate_chat_body(chat)
    call = AnthropicDialect().build_call(request, PROVIDER)
    sent = json.loads(call.body)
    # Consecutive user messages merge into one turn; at most four breakpoints in all (the
    # tool's first), an unknown ttl left out.
    (turn,) = sent["messages"]
    assert [b.get("cache_control") for b in turn["content"]] == [EPHEMERAL] * 3 + [None] * 7
    assert sent["tools"][0]["cache_control"] == EPHEMERAL
    for field in ("context_management", "service_tier", "unknown", "anthropic_extras"):
        assert field not in sent
    assert call.headers["anthropic-beta"] == "ok-1"


def test_no_other_provider_gets_them() -> None:
    chat = translate(messages_body(context_management={"edits": [CLEAR_TOOLS]})).body
    assert "anthropic_extras" in chat
    vllm = ProviderConfig(name="v", type="openai_compatible", model="m", base_url="http://v:8000")
    call = OpenAICompatibleDialect().build_call(validate_chat_body(chat), vllm)
    assert b"anthropic_extras" not in call.body and b"cache_control" not in call.body
    assert "anthropic-beta" not in call.headers
    # count_tokens keeps nothing: its body is only measured.
    assert "anthropic_extras" not in translate(messages_body(), count_only=True).body
