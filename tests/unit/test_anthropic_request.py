"""The anthropic dialect's request translation apart from the messages: the call (URL and
headers), tool_choice, max_tokens, thinking, the sampling fields, response_format, and the
fields it drops, strips or refuses. Every body is checked against the ``anthropic`` SDK's
TypedDicts."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from tests.unit.anthropic_helpers import (
    NAME,
    PLAIN_PROVIDER,
    PROVIDER,
    TIME_TOOL,
    USER,
    WEATHER_TOOL,
    conversation_with_tools,
    translate,
)
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import (
    InvalidRequest,
    UnsupportedParameter,
)
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.anthropic.dialect import (
    DROPPED_FIELDS,
    AnthropicDialect,
)
from trio_gateway.providers.anthropic.request import build_body
from trio_gateway.providers.dialect import Dialect


def test_build_call() -> None:
    dialect: Dialect = AnthropicDialect()
    request = validate_chat_body({"model": "alias", "messages": [USER], "stream": False})
    call = dialect.build_call(request, PROVIDER)
    assert call.url == "https://api.anthropic.com/v1/messages"
    assert call.headers == {
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
        "accept": "text/event-stream",
    }
    assert json.loads(call.body) == build_body(request, PROVIDER)
    other = ProviderConfig(name="x", type="anthropic", model="m", base_url="http://proxy:9/")
    assert dialect.build_call(request, other).url == "http://proxy:9/v1/messages"
    assert dialect.auth_headers("sk-ant-123") == {"x-api-key": "sk-ant-123"}


TOOLS = {"tools": [WEATHER_TOOL]}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"tool_choice": "auto"}, {"type": "auto"}),
        ({"tool_choice": "none"}, {"type": "none"}),
        ({"tool_choice": "required"}, {"type": "any"}),
        ({"tool_choice": NAMED}, {"type": "tool", "name": "get_weather"}),
        ({"parallel_tool_calls": True}, None),
        ({"parallel_tool_calls": False}, {"type": "auto", "disable_parallel_tool_use": True}),
        (
            {"tool_choice": "required", "parallel_tool_calls": False},
            {"type": "any", "disable_parallel_tool_use": True},
        ),
        (
            {"tool_choice": NAMED, "parallel_tool_calls": False},
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        ),
        ({"tool_choice": "none", "parallel_tool_calls": False}, {"type": "none"}),
    ],
)
def test_tool_choice(fields: dict[str, Any], expected: dict[str, Any] | None) -> None:
    out = translate({"messages": [USER], **TOOLS, **fields})
    assert out.get("tool_choice") == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"tool_choice": "required"}, {"type": "auto"}),
        ({"tool_choice": NAMED}, {"type": "auto"}),
        ({"tool_choice": "none"}, {"type": "none"}),
        (
            {"tool_choice": "required", "parallel_tool_calls": False},
            {"type": "auto", "disable_parallel_tool_use": True},
        ),
    ],
)
def test_thinking_cannot_force_a_tool(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    out = translate({"messages": [USER], **TOOLS, **fields, "reasoning": True})
    assert out["tool_choice"] == expected


def test_strict_tools_stay_strict() -> None:
    tool = {"type": "function", "function": {**WEATHER_TOOL["function"], "strict": True}}  # type: ignore[dict-item]
    out = translate({"messages": [USER], "tools": [tool]})
    assert out["tools"][0]["strict"] is True


@pytest.mark.parametrize(
    ("fields", "provider", "max_tokens"),
    [
        ({}, PROVIDER, 4096),
        ({"max_tokens": 100}, PROVIDER, 100),
        ({"max_completion_tokens": 200}, PROVIDER, 200),
        ({"max_tokens": 100, "max_completion_tokens": 200}, PROVIDER, 200),
        ({"max_tokens": None}, PROVIDER, 4096),
        # Never past the model's output cap (Anthropic refuses more): Sonnet 4.5 writes at
        # most 64000, Haiku 3.5 8192, a model the table does not know 4096 unless the
        # operator says otherwise.
        ({"max_tokens": 100000}, PROVIDER, 64000),
        ({"max_completion_tokens": 9000}, PLAIN_PROVIDER, 8192),
        ({"max_tokens": 9000}, attrs.evolve(PLAIN_PROVIDER, model="claude-next"), 4096),
        (
            {"max_tokens": 9000},
            attrs.evolve(PLAIN_PROVIDER, model="claude-next", max_output_tokens=128000),
            9000,
        ),
        ({}, attrs.evolve(PLAIN_PROVIDER, default_max_tokens=20000), 8192),
        # A limit the provider strips is not the client's any more.
        ({"max_tokens": 100}, attrs.evolve(PROVIDER, strip_fields=("max_tokens",)), 4096),
    ],
)
def test_max_tokens(fields: dict[str, Any], provider: ProviderConfig, max_tokens: int) -> None:
    request = validate_chat_body({"model": "alias", "messages": [USER], **fields})
    assert translate({"messages": [USER], **fields}, provider)["max_tokens"] == max_tokens
    # The budget hold is computed from what is sent.
    assert AnthropicDialect().max_output_tokens(request, provider) == max_tokens


def enabled(budget: int) -> dict[str, Any]:
    return {"type": "enabled", "budget_tokens": budget}


@pytest.mark.parametrize(
    ("fields", "thinking", "max_tokens"),
    [
        # The thinking budget comes out of the limit (Anthropic counts thinking inside
        # max_tokens, as OpenAI counts reasoning inside max_completion_tokens), never on top.
        ({"reasoning": True}, enabled(4095), 4096),
        ({"reasoning": True, "max_tokens": 20000}, enabled(8192), 20000),
        ({"reasoning": True, "max_tokens": 8192}, enabled(8191), 8192),
        ({"reasoning_effort": "minimal"}, enabled(1024), 4096),
        ({"reasoning_effort": "high"}, enabled(4095), 4096),
        ({"reasoning_effort": "xhigh", "max_completion_tokens": 40000}, enabled(32768), 40000),
        # The model's cap bounds the whole, thinking included.
        ({"reasoning_effort": "xhigh", "max_tokens": 100000}, enabled(32768), 64000),
        # Too small a limit for Anthropic's least budget (1024 < max_tokens): no thinking.
        ({"reasoning": True, "max_tokens": 100}, {"type": "disabled"}, 100),
        ({"reasoning_effort": "low", "max_tokens": 1024}, {"type": "disabled"}, 1024),
        ({"reasoning_effort": "low", "max_tokens": 1025}, enabled(1024), 1025),
        ({"reasoning": False}, {"type": "disabled"}, 4096),
        ({"reasoning_effort": "none"}, {"type": "disabled"}, 4096),
        ({}, None, 4096),
    ],
)
def test_thinking(fields: dict[str, Any], thinking: dict[str, Any] | None, max_tokens: int) -> None:
    out = translate({"messages": [USER], **fields})
    assert out.get("thinking") == thinking
    assert out["max_tokens"] == max_tokens
    assert "reasoning" not in out and "reasoning_effort" not in out


def test_thinking_turned_off_by_a_small_limit_keeps_the_sampling_fields() -> None:
    out = translate(
        {"messages": [USER], "reasoning": True, "max_tokens": 100, "temperature": 0.3, "top_k": 5}
    )
    assert (out["temperature"], out["top_k"]) == (0.3, 5)
    assert "thinking" not in translate(
        {"messages": [USER], "reasoning": True, "max_tokens": 100}, PLAIN_PROVIDER
    )


def test_reasoning_pauses_mid_tool_loop() -> None:
    """Anthropic wants the last tool-calling assistant turn to open with its signed thinking
    block, which an OpenAI conversation cannot carry: that step is sent unthinking."""
    body = {
        "messages": conversation_with_tools()[:4],
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "reasoning_effort": "high",
        "temperature": 0.3,
        "tool_choice": "required",
    }
    out = translate(body)
    assert out["thinking"] == {"type": "disabled"}
    assert (out["max_tokens"], out["temperature"], out["tool_choice"]) == (
        4096,
        0.3,
        {"type": "any"},
    )
    assert "thinking" not in translate(body, PLAIN_PROVIDER)
    # Once the assistant has answered in words, the next turn thinks again.
    body["messages"] = [
        *conversation_with_tools(),
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "And Lyon?"},
    ]
    # High effort's 16384 come out of the 4096 the request may produce.
    assert translate(body)["thinking"] == {"type": "enabled", "budget_tokens": 4095}


def test_reasoning_off_is_not_said_to_a_model_that_cannot_think() -> None:
    assert "thinking" not in translate({"messages": [USER], "reasoning": False}, PLAIN_PROVIDER)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"temperature": 0.7}, {"temperature": 0.7}),
        ({"temperature": 0}, {"temperature": 0.0}),
        ({"temperature": 1.6}, {"temperature": 1.0}),
        ({"temperature": 2}, {"temperature": 1.0}),
        ({"top_p": 0.9}, {"top_p": 0.9}),
        ({"top_k": 40}, {"top_k": 40}),
        ({"top_k": -1}, {}),
        ({"top_k": 0}, {}),
        ({"stop": "END"}, {"stop_sequences": ["END"]}),
        ({"stop": ["a", "b"]}, {"stop_sequences": ["a", "b"]}),
        ({"stop": []}, {}),
        # Anthropic refuses a whitespace-only stop sequence: dropped (docs/providers.md).
        ({"stop": "\n"}, {}),
        ({"stop": ["\n", "END", " \t\u3000", "x\n"]}, {"stop_sequences": ["END", "x\n"]}),
        ({"user": "u-42"}, {"metadata": {"user_id": "u-42"}}),
        ({"safety_identifier": "hash-1"}, {"metadata": {"user_id": "hash-1"}}),
        ({"user": "u-42", "safety_identifier": "hash-1"}, {"metadata": {"user_id": "u-42"}}),
        ({"temperature": None, "top_p": None, "stop": None, "user": None}, {}),
        # With thinking on: temperature and top_k unset, top_p at least 0.95.
        ({"reasoning": True, "temperature": 0.2, "top_k": 5}, {}),
        ({"reasoning": True, "top_p": 0.5}, {"top_p": 0.95}),
        ({"reasoning": True, "top_p": 0.98}, {"top_p": 0.98}),
    ],
)
def test_sampling_fields(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    out = translate({"messages": [USER], **fields})
    keys = ("temperature", "top_p", "top_k", "stop_sequences", "metadata")
    assert {k: out[k] for k in keys if k in out} == expected


def test_bad_top_k_is_the_clients_error() -> None:
    with pytest.raises(InvalidRequest) as info:
        translate({"messages": [USER], "top_k": "many"})
    assert info.value.param == "top_k"


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
            },
            {"format": {"type": "json_schema", "schema": SCHEMA}},
        ),
        ({"type": "text"}, None),
    ],
)
def test_response_format(response_format: dict[str, Any], expected: dict[str, Any] | None) -> None:
    out = translate({"messages": [USER], "response_format": response_format})
    assert out.get("output_config") == expected


def test_json_object_is_refused_not_dropped() -> None:
    """Anthropic has no JSON mode without a schema: dropping the field would answer free text
    to a client that asked for JSON."""
    with pytest.raises(UnsupportedParameter) as info:
        translate({"messages": [USER], "response_format": {"type": "json_object"}})
    assert info.value.param == "response_format"
    assert info.value.code == "unsupported_parameter"
    assert "json_object" in info.value.message


def test_json_schema_without_a_schema_is_refused() -> None:
    with pytest.raises(InvalidRequest) as info:
        translate(
            {
                "messages": [USER],
                "response_format": {"type": "json_schema", "json_schema": {"name": "a"}},
            }
        )
    assert info.value.param == "response_format.json_schema.schema"


EVERY_DROPPED_FIELD: dict[str, Any] = {
    "stream_options": {"include_usage": True},
    "n": 1,
    "logprobs": False,
    "top_logprobs": 0,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "logit_bias": {"50256": -100},
    "seed": 7,
    "store": True,
    "metadata": {"k": "v"},
    "service_tier": "flex",
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {},
    "verbosity": "low",
    "prediction": {"type": "content", "content": "x"},
    "moderation": {},
    "audio": {"voice": "alloy", "format": "mp3"},
    "modalities": ["text"],
}


def test_every_dropped_field_is_dropped_and_unknown_fields_too() -> None:
    assert set(EVERY_DROPPED_FIELD) == DROPPED_FIELDS
    out = translate(
        {
            "messages": [USER],
            "stream": True,
            **EVERY_DROPPED_FIELD,
            "chat_template_kwargs": {"enable_thinking": False},
            "guided_json": {},
            "reasoning": None,
        }
    )
    assert out == translate({"messages": [USER]})


def test_strip_fields_are_dropped_before_translation() -> None:
    provider = ProviderConfig(
        name=NAME, type="anthropic", model="m", strip_fields=("temperature", "user")
    )
    out = translate({"messages": [USER], "temperature": 0.5, "user": "u", "top_p": 0.5}, provider)
    assert "temperature" not in out and "metadata" not in out
    assert out["top_p"] == 0.5


def test_the_clients_body_is_not_changed() -> None:
    body = {
        "model": "alias",
        "messages": conversation_with_tools(),
        "tools": [WEATHER_TOOL, TIME_TOOL],
    }
    before = json.dumps(body)
    build_body(validate_chat_body(body), PROVIDER)
    assert json.dumps(body) == before
