"""Shared by the anthropic dialect's unit tests: the providers and request parts they send,
``translate`` (an OpenAI body through the gateway's validation and ``build_body``), and the
check of every body against the ``anthropic`` SDK's TypedDicts (Anthropic rejects keys they
do not allow)."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Mapping
from typing import Any

from anthropic import types as at
from anthropic.types.message_create_params import MessageCreateParamsStreaming

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.anthropic.request import build_body

NAME = "claude-a"
PROVIDER = ProviderConfig(
    name=NAME,
    type="anthropic",
    model="claude-sonnet-4-5",
    default_max_tokens=4096,
    capabilities=frozenset({Capability.TOOLS, Capability.VISION, Capability.REASONING}),
)
PLAIN_PROVIDER = ProviderConfig(name=NAME, type="anthropic", model="claude-3-5-haiku")
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake").decode()
PDF = base64.b64encode(b"%PDF-1.4 fake").decode()
USER = {"role": "user", "content": "Hi"}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time"}}


# --- request translation -----------------------------------------------------------------------


def translate(body: dict[str, Any], provider: ProviderConfig = PROVIDER) -> dict[str, Any]:
    """The Anthropic body for an OpenAI body, after the gateway's own validation."""
    request = validate_chat_body({"model": "alias", **body})
    out = build_body(request, provider)
    assert_conforms_to_sdk(out)
    return out


def _keys_fit(value: Mapping[str, Any], typed: Any, where: str) -> None:
    keys = set(value)
    missing = set(typed.__required_keys__) - keys
    extra = keys - set(typed.__required_keys__) - set(typed.__optional_keys__)
    assert not missing, f"{where}: missing {missing}"
    assert not extra, f"{where}: not in the SDK's {typed.__name__}: {extra}"


BLOCK_TYPES: dict[str, Any] = {
    "text": at.TextBlockParam,
    "image": at.ImageBlockParam,
    "document": at.DocumentBlockParam,
    "tool_use": at.ToolUseBlockParam,
    "tool_result": at.ToolResultBlockParam,
    "thinking": at.ThinkingBlockParam,
    "redacted_thinking": at.RedactedThinkingBlockParam,
}
TOOL_CHOICE_TYPES: dict[str, Any] = {
    "auto": at.ToolChoiceAutoParam,
    "any": at.ToolChoiceAnyParam,
    "tool": at.ToolChoiceToolParam,
    "none": at.ToolChoiceNoneParam,
}
THINKING_TYPES: dict[str, Any] = {
    "enabled": at.ThinkingConfigEnabledParam,
    "disabled": at.ThinkingConfigDisabledParam,
}


# The Messages API's sampling knobs. SDK 2.x no longer types them (the newest models refuse
# them; operators strip them per provider with `strip_fields`), while the models before take them.
SAMPLING_FIELDS = ("temperature", "top_p", "top_k")


def assert_conforms_to_sdk(body: dict[str, Any]) -> None:
    """Every object in ``body`` has exactly the keys the SDK's TypedDicts allow (Anthropic
    rejects extra ones), the required ones included."""
    _keys_fit(
        {k: v for k, v in body.items() if k not in SAMPLING_FIELDS},
        MessageCreateParamsStreaming,
        "body",
    )
    assert body["stream"] is True
    for block in body.get("system", ()):
        _keys_fit(block, at.TextBlockParam, "system")
        assert block["text"], "empty system text"
    roles = [m["role"] for m in body["messages"]]
    assert roles[0] == "user"
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    for message in body["messages"]:
        _keys_fit(message, at.MessageParam.__args__[0], "message")  # type: ignore[attr-defined]
        for block in message["content"]:
            _keys_fit(block, BLOCK_TYPES[block["type"]], f"{block['type']} block")
            if block["type"] == "text":
                assert block["text"], "empty text block"
            if block["type"] == "image":
                source = block["source"]
                typed = (
                    at.URLImageSourceParam if source["type"] == "url" else at.Base64ImageSourceParam
                )
                _keys_fit(source, typed, "image source")
    for tool in body.get("tools", ()):
        _keys_fit(tool, at.ToolParam, "tool")
    if "tool_choice" in body:
        _keys_fit(
            body["tool_choice"], TOOL_CHOICE_TYPES[body["tool_choice"]["type"]], "tool_choice"
        )
    if "thinking" in body:
        _keys_fit(body["thinking"], THINKING_TYPES[body["thinking"]["type"]], "thinking")
    if "metadata" in body:
        _keys_fit(body["metadata"], at.MetadataParam, "metadata")
    if "output_config" in body:
        _keys_fit(body["output_config"], at.OutputConfigParam, "output_config")
        _keys_fit(body["output_config"]["format"], at.JSONOutputFormatParam, "output format")


def conversation_with_tools() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather and time in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "functions.get_time:1",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": ""},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {
            "role": "tool",
            "tool_call_id": "functions.get_time:1",
            "content": [{"type": "text", "text": "12:00"}, {"type": "text", "text": "CET"}],
        },
        {"role": "user", "content": "Thanks, and tomorrow?"},
    ]
