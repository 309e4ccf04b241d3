"""The anthropic dialect's pure parts: request translation, stream and whole-answer parsing, and
error classification. Transcripts are written by hand in Anthropic's documented stream format
and checked against the ``anthropic`` SDK's own types; request bodies against its TypedDicts."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from anthropic import types as at
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    QuotaExhausted,
    UnsupportedParameter,
    UpstreamAuthFailed,
    UpstreamOverloaded,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamServerError,
    UpstreamTimeout,
)
from trio_gateway.core.events import (
    Event,
    ReasoningDelta,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.request import validate_chat_body
from trio_gateway.core.sse import SSEDecoder, SSEEvent
from trio_gateway.providers.anthropic.dialect import (
    DROPPED_FIELDS,
    MAX_OPEN_BLOCKS,
    MAX_TOOL_CALLS,
    AnthropicDialect,
    AnthropicStreamParser,
    classify_error,
    parse_whole,
)
from trio_gateway.providers.anthropic.request import LEADING_USER_TEXT, build_body
from trio_gateway.providers.dialect import Dialect

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


def test_minimal_body() -> None:
    assert translate({"messages": [USER]}) == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "stream": True,
    }


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


def test_system_and_developer_messages_become_top_level_system_in_order() -> None:
    out = translate(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                USER,
                {"role": "developer", "content": [{"type": "text", "text": "Use French."}]},
                {"role": "system", "content": ""},
                {"role": "assistant", "content": "Salut"},
                {"role": "user", "content": "Again"},
            ]
        }
    )
    assert out["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Use French."},
    ]
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Salut"}]},
        {"role": "user", "content": [{"type": "text", "text": "Again"}]},
    ]


def test_user_parts_text_and_images() -> None:
    out = translate(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "text", "text": ""},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "high"},
                        },
                        {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
                    ],
                }
            ]
        }
    )
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
    ]


def test_pdf_file_part_becomes_a_document() -> None:
    for file_data in (f"data:application/pdf;base64,{PDF}", PDF):
        out = translate(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "file", "file": {"file_data": file_data, "filename": "a.pdf"}}
                        ],
                    }
                ]
            }
        )
        assert out["messages"][0]["content"] == [
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
            }
        ]


@pytest.mark.parametrize(
    ("part", "error", "param"),
    [
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}},
            InvalidRequest,
            "messages[0].content[0].image_url.url",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            UnsupportedParameter,
            "messages[0].content[0].type",
        ),
        (
            {"type": "file", "file": {"file_id": "file-1"}},
            UnsupportedParameter,
            "messages[0].content[0].file",
        ),
        (
            {"type": "file", "file": {"file_data": f"data:text/plain;base64,{PDF}"}},
            UnsupportedParameter,
            "messages[0].content[0].file.file_data",
        ),
    ],
)
def test_user_parts_anthropic_cannot_take(
    part: dict[str, Any], error: type[GatewayError], param: str
) -> None:
    with pytest.raises(error) as info:
        translate({"messages": [{"role": "user", "content": [part]}]})
    assert type(info.value) is error
    assert info.value.param == param


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


def test_tool_calls_and_results() -> None:
    out = translate({"messages": conversation_with_tools(), "tools": [WEATHER_TOOL, TIME_TOOL]})
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather and time in Paris?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                # Anthropic ids are [a-zA-Z0-9_-]+: the same mapping on both sides keeps the pair.
                {"type": "tool_use", "id": "functions_get_time_1", "name": "get_time", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "functions_get_time_1",
                    "content": [{"type": "text", "text": "12:00"}, {"type": "text", "text": "CET"}],
                },
                {"type": "text", "text": "Thanks, and tomorrow?"},
            ],
        },
    ]
    assert out["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
        {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
    ]


def test_tool_results_come_first_in_their_user_turn_and_empty_result_has_no_content() -> None:
    messages = [
        *conversation_with_tools()[:2],
        {"role": "user", "content": "(also: hurry)"},
        {"role": "tool", "tool_call_id": "call_1", "content": ""},
        {"role": "tool", "tool_call_id": "functions.get_time:1", "content": "12:00"},
    ]
    out = translate({"messages": messages, "tools": [WEATHER_TOOL, TIME_TOOL]})
    assert out["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_1"},
            {"type": "tool_result", "tool_use_id": "functions_get_time_1", "content": "12:00"},
            {"type": "text", "text": "(also: hurry)"},
        ],
    }


@pytest.mark.parametrize(
    ("arguments", "message"),
    [("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object"), ('"x"', "JSON object")],
)
def test_unparseable_tool_arguments_name_their_path(arguments: str, message: str) -> None:
    messages = conversation_with_tools()
    messages[1]["tool_calls"][1]["function"]["arguments"] = arguments
    with pytest.raises(InvalidRequest) as info:
        translate({"messages": messages, "tools": [WEATHER_TOOL, TIME_TOOL]})
    assert info.value.param == "messages[1].tool_calls[1].function.arguments"
    assert message in info.value.message


def test_consecutive_same_roles_merge_and_empty_messages_vanish() -> None:
    out = translate(
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "user", "content": ""},
                {"role": "user", "content": [{"type": "text", "text": "b"}]},
                {"role": "assistant", "content": ""},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
                {"role": "assistant", "content": None, "refusal": "Still no."},
            ]
        }
    )
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "No."}, {"type": "text", "text": "Still no."}],
        },
    ]


def test_conversation_opening_with_the_assistant_gets_a_user_turn_first() -> None:
    out = translate(
        {
            "messages": [
                {"role": "system", "content": "You are a shop assistant."},
                {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "Shoes"},
            ]
        }
    )
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": LEADING_USER_TEXT}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello! How can I help?"}]},
        {"role": "user", "content": [{"type": "text", "text": "Shoes"}]},
    ]


def test_nothing_left_to_send_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest) as info:
        translate(
            {
                "messages": [
                    {"role": "system", "content": "only rules"},
                    {"role": "user", "content": ""},
                ]
            }
        )
    assert info.value.param == "messages"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_fields_whose_loss_would_change_the_answer_are_refused(
    extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(UnsupportedParameter) as info:
        translate({"messages": [USER], **extra})
    assert info.value.param == param


def test_function_role_and_assistant_function_call_are_refused() -> None:
    with pytest.raises(UnsupportedParameter) as info:
        translate({"messages": [USER, {"role": "function", "name": "f", "content": "1"}]})
    assert info.value.param == "messages[1].role"
    with pytest.raises(UnsupportedParameter) as info:
        translate(
            {
                "messages": [
                    USER,
                    {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
                ]
            }
        )
    assert info.value.param == "messages[1].function_call"


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
    ("fields", "max_tokens"),
    [
        ({}, 4096),
        ({"max_tokens": 100}, 100),
        ({"max_completion_tokens": 200}, 200),
        ({"max_tokens": 100, "max_completion_tokens": 200}, 200),
        ({"max_tokens": None}, 4096),
    ],
)
def test_max_tokens(fields: dict[str, Any], max_tokens: int) -> None:
    assert translate({"messages": [USER], **fields})["max_tokens"] == max_tokens


@pytest.mark.parametrize(
    ("fields", "thinking", "max_tokens"),
    [
        # Default effort (medium): 8192 thinking tokens; a 4096 limit leaves no room, so the
        # answer's 4096 go on top.
        ({"reasoning": True}, {"type": "enabled", "budget_tokens": 8192}, 8192 + 4096),
        (
            {"reasoning": True, "max_tokens": 20000},
            {"type": "enabled", "budget_tokens": 8192},
            20000,
        ),
        (
            {"reasoning": True, "max_tokens": 8192},
            {"type": "enabled", "budget_tokens": 8192},
            16384,
        ),
        ({"reasoning_effort": "minimal"}, {"type": "enabled", "budget_tokens": 1024}, 4096),
        (
            {"reasoning_effort": "low", "max_tokens": 10},
            {"type": "enabled", "budget_tokens": 2048},
            2058,
        ),
        ({"reasoning_effort": "high"}, {"type": "enabled", "budget_tokens": 16384}, 16384 + 4096),
        (
            {"reasoning_effort": "xhigh", "max_completion_tokens": 40000},
            {"type": "enabled", "budget_tokens": 32768},
            40000,
        ),
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
    assert translate(body)["thinking"] == {"type": "enabled", "budget_tokens": 16384}


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
        ({"type": "json_object"}, None),
        ({"type": "text"}, None),
    ],
)
def test_response_format(response_format: dict[str, Any], expected: dict[str, Any] | None) -> None:
    out = translate({"messages": [USER], "response_format": response_format})
    assert out.get("output_config") == expected


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


# --- streams -----------------------------------------------------------------------------------


def sse(kind: str, **data: Any) -> bytes:
    payload = json.dumps({"type": kind, **data}, ensure_ascii=False)
    return f"event: {kind}\ndata: {payload}\n\n".encode()


def start(usage: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage if usage is not None else {"input_tokens": 10, "output_tokens": 1},
    }
    return sse("message_start", message=message)


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return sse("content_block_start", index=index, content_block=block)


def delta(index: int, **d: Any) -> bytes:
    return sse("content_block_delta", index=index, delta=d)


def stop(index: int) -> bytes:
    return sse("content_block_stop", index=index)


def end(stop_reason: str = "end_turn", usage: dict[str, Any] | None = None) -> bytes:
    return sse(
        "message_delta",
        delta={"stop_reason": stop_reason, "stop_sequence": None},
        usage=usage if usage is not None else {"output_tokens": 5},
    ) + sse("message_stop")


def tool(index: int, tool_id: str, name: str) -> bytes:
    return block_start(index, {"type": "tool_use", "id": tool_id, "name": name, "input": {}})


# Thinking, text (with a ping inside), and two tool calls, one with an escape cut across
# fragments and one without input; cache tokens on both sides.
RICH = b"".join(
    [
        start(
            {
                "input_tokens": 25,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 50,
                "output_tokens": 1,
            }
        ),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Paris, "),
        delta(0, type="thinking_delta", thinking="then the time."),
        delta(0, type="signature_delta", signature="EqQBCgIYAhIM1gbcDa9GJwZA2b3h"),
        stop(0),
        block_start(1, {"type": "text", "text": ""}),
        sse("ping"),
        delta(1, type="text_delta", text="Checking "),
        delta(1, type="text_delta", text="météo 東京 ☀"),
        stop(1),
        tool(2, "toolu_01A", "get_weather"),
        delta(2, type="input_json_delta", partial_json=""),
        delta(2, type="input_json_delta", partial_json='{"city": "Par\\'),
        delta(2, type="input_json_delta", partial_json='u00eds \\"'),
        delta(2, type="input_json_delta", partial_json='centre\\""}'),
        stop(2),
        tool(3, "toolu_01B", "get_time"),
        stop(3),
        end("tool_use", {"output_tokens": 87}),
    ]
)
RICH_EVENTS: list[Event] = [
    ResponseStarted(NAME),
    ReasoningDelta("Paris, "),
    ReasoningDelta("then the time."),
    TextDelta("Checking "),
    TextDelta("météo 東京 ☀"),
    ToolCallDelta(0, "toolu_01A", "get_weather", ""),
    ToolCallDelta(0, None, None, '{"city": "Par\\'),
    ToolCallDelta(0, None, None, 'u00eds \\"'),
    ToolCallDelta(0, None, None, 'centre\\""}'),
    ToolCallDelta(1, "toolu_01B", "get_time", ""),
    ToolCallDelta(1, None, None, "{}"),
    ToolCallDone(
        0,
        "toolu_01A",
        "get_weather",
        {"city": 'París "centre"'},
        '{"city": "Par\\u00eds \\"centre\\""}',
        True,
    ),
    ToolCallDone(1, "toolu_01B", "get_time", {}, "{}", True),
    Usage(prompt_tokens=175, completion_tokens=87, reasoning_tokens=None, cached_tokens=100),
    ResponseDone("tool_calls"),
]


def parse_chunks(chunks: Iterable[bytes]) -> list[Event]:
    decoder = SSEDecoder()
    parser = AnthropicStreamParser(NAME)
    events: list[Event] = []
    for chunk in chunks:
        for event in decoder.feed(chunk):
            events += parser.feed(event)
    for event in decoder.close():
        events += parser.feed(event)
    return events + parser.close()


def test_rich_stream_whole() -> None:
    assert parse_chunks([RICH]) == RICH_EVENTS


def test_rich_stream_split_at_every_byte() -> None:
    for cut in range(len(RICH) + 1):
        assert parse_chunks([RICH[:cut], RICH[cut:]]) == RICH_EVENTS, cut


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(RICH)), max_size=30))
def test_rich_stream_split_anywhere(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(RICH)]
    assert parse_chunks(RICH[a:b] for a, b in itertools.pairwise(points)) == RICH_EVENTS


def test_rich_stream_is_what_the_sdk_reads() -> None:
    """The SDK accumulates the same transcript into a Message; parsing that Message whole gives
    the same answer the stream gave."""
    adapter: TypeAdapter[Any] = TypeAdapter(at.RawMessageStreamEvent)
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    decoder = SSEDecoder()
    for raw in decoder.feed(RICH):
        assert raw.event == json.loads(raw.data)["type"]
        if raw.event == "ping":  # the SDK's stream skips it before typing events
            continue
        event = adapter.validate_json(raw.data)  # strict: the transcript is Anthropic's format
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    assert snapshot.content[2].input == {"city": 'París "centre"'}  # type: ignore[union-attr]
    whole = parse_whole(NAME, snapshot.model_dump_json().encode())
    assert whole == [
        ResponseStarted(NAME),
        ReasoningDelta("Paris, then the time."),
        TextDelta("Checking météo 東京 ☀"),
        ToolCallDelta(0, "toolu_01A", "get_weather", '{"city": "París \\"centre\\""}'),
        ToolCallDelta(1, "toolu_01B", "get_time", ""),
        ToolCallDelta(1, None, None, "{}"),
        ToolCallDone(
            0,
            "toolu_01A",
            "get_weather",
            {"city": 'París "centre"'},
            '{"city": "París \\"centre\\""}',
            True,
        ),
        ToolCallDone(1, "toolu_01B", "get_time", {}, "{}", True),
        Usage(prompt_tokens=175, completion_tokens=87, reasoning_tokens=None, cached_tokens=100),
        ResponseDone("tool_calls"),
    ]


TRICKY_INPUT = {"q": 'a "quoted" \\ back\nslash', "u": "é東☀\U0001f600", "n": [1, 2.5, None, True]}


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_partial_json_cut_anywhere_even_inside_escapes(data: st.DataObject) -> None:
    text = json.dumps(TRICKY_INPUT)  # ASCII escapes: \" \\ \n \u00e9 \ud83d\ude00
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    points = [0, *cuts, len(text)]
    fragments = [text[a:b] for a, b in itertools.pairwise(points)]
    raw = (
        start()
        + tool(0, "toolu_X", "search")
        + b"".join(delta(0, type="input_json_delta", partial_json=f) for f in fragments)
        + stop(0)
        + end("tool_use")
    )
    events = parse_chunks([raw])
    done = [e for e in events if isinstance(e, ToolCallDone)]
    assert done == [ToolCallDone(0, "toolu_X", "search", TRICKY_INPUT, text, True)]
    streamed = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
    assert streamed == text


def test_text_only_stream() -> None:
    raw = (
        start()
        + block_start(0, {"type": "text", "text": ""})
        + delta(0, type="text_delta", text="Hi")
        + stop(0)
        + end()
    )
    assert parse_chunks([raw]) == [
        ResponseStarted(NAME),
        TextDelta("Hi"),
        Usage(10, 5, None, None),
        ResponseDone("stop"),
    ]


def test_ignored_blocks_and_deltas() -> None:
    raw = b"".join(
        [
            sse("ping"),
            start(),
            block_start(0, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}),
            stop(0),
            block_start(
                1,
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
            ),
            delta(1, type="input_json_delta", partial_json='{"query": "x"}'),
            stop(1),
            block_start(2, {"type": "text", "text": ""}),
            delta(2, type="citations_delta", citation={"type": "char_location"}),
            delta(2, type="some_future_delta", x=1),
            delta(2, type="text_delta", text="ok"),
            stop(2),
            sse("some_future_event", x=1),
            end(),
        ]
    )
    assert parse_chunks([raw]) == [
        ResponseStarted(NAME),
        TextDelta("ok"),
        Usage(10, 5, None, None),
        ResponseDone("stop"),
    ]


@pytest.mark.parametrize(
    ("stop_reason", "with_tool", "finish_reason"),
    [
        ("end_turn", False, "stop"),
        ("stop_sequence", False, "stop"),
        ("pause_turn", False, "stop"),
        ("max_tokens", False, "length"),
        ("model_context_window_exceeded", False, "length"),
        ("tool_use", True, "tool_calls"),
        ("refusal", False, "content_filter"),
        ("something_new", False, "stop"),
        ("end_turn", True, "tool_calls"),
        ("max_tokens", True, "length"),
    ],
)
def test_finish_reasons(stop_reason: str, with_tool: bool, finish_reason: str) -> None:
    blocks = tool(0, "toolu_1", "f") + stop(0) if with_tool else b""
    events = parse_chunks([start() + blocks + end(stop_reason)])
    assert events[-1] == ResponseDone(finish_reason)


@pytest.mark.parametrize(
    ("start_usage", "end_usage", "expected"),
    [
        ({"input_tokens": 10, "output_tokens": 1}, {"output_tokens": 5}, Usage(10, 5, None, None)),
        (
            {
                "input_tokens": 10,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 20,
                "output_tokens": 1,
            },
            {"output_tokens": 7},
            Usage(130, 7, None, 100),
        ),
        (
            {
                "input_tokens": 3,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
                "output_tokens": 1,
            },
            {"output_tokens": 2},
            Usage(3, 2, None, 0),
        ),
        # Newer models repeat the (cumulative) input side in message_delta: the last one counts.
        (
            {"input_tokens": 10, "cache_read_input_tokens": 1, "output_tokens": 1},
            {"input_tokens": 12, "cache_read_input_tokens": 3, "output_tokens": 9},
            Usage(15, 9, None, 3),
        ),
        (
            {"input_tokens": 10, "output_tokens": 1},
            {"output_tokens": 50, "output_tokens_details": {"thinking_tokens": 40}},
            Usage(10, 50, 40, None),
        ),
        (
            {"input_tokens": 10, "output_tokens": 1},
            {"output_tokens": 3, "output_tokens_details": {"thinking_tokens": 0}},
            Usage(10, 3, 0, None),
        ),
        ({"input_tokens": 10, "output_tokens": 1}, {}, Usage(10, 1, None, None)),
        ({"input_tokens": None, "output_tokens": 1}, {"output_tokens": 4}, Usage(0, 4, None, None)),
    ],
)
def test_usage_arithmetic(
    start_usage: dict[str, Any], end_usage: dict[str, Any], expected: Usage
) -> None:
    events = parse_chunks([start(start_usage) + end("end_turn", end_usage)])
    assert events == [ResponseStarted(NAME), expected, ResponseDone("stop")]


def test_parser_is_done_only_after_message_stop() -> None:
    parser = AnthropicStreamParser(NAME)
    decoder = SSEDecoder()
    raw = start() + end()
    events = decoder.feed(raw)
    for event in events[:-1]:
        parser.feed(event)
        assert not parser.done
    parser.feed(events[-1])
    assert parser.done
    assert parser.close() == []


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ({"type": "overloaded_error", "message": "Overloaded"}, UpstreamOverloaded),
        ({"type": "rate_limit_error", "message": "slow down"}, UpstreamRateLimited),
        ({"type": "api_error", "message": "Internal server error"}, UpstreamServerError),
        ({"type": "timeout_error", "message": "timed out"}, UpstreamTimeout),
        ({"type": "invalid_request_error", "message": "bad"}, InvalidRequest),
        (
            {"type": "invalid_request_error", "message": "prompt is too long: 2 > 1"},
            ContextLengthExceeded,
        ),
        ({"type": "billing_error", "message": "no money"}, QuotaExhausted),
        ({"type": "authentication_error", "message": "invalid key"}, UpstreamAuthFailed),
        ({"type": "new_kind_of_error", "message": "??"}, UpstreamServerError),
        ("not an object", UpstreamServerError),
    ],
)
def test_error_event_mid_stream(error: object, expected: type[GatewayError]) -> None:
    raw = (
        start()
        + block_start(0, {"type": "text", "text": ""})
        + delta(0, type="text_delta", text="Hel")
    )
    raw += sse("error", error=error)
    decoder = SSEDecoder()
    parser = AnthropicStreamParser(NAME)
    events = decoder.feed(raw)
    for event in events[:-1]:
        parser.feed(event)
    with pytest.raises(GatewayError) as info:
        parser.feed(events[-1])
    assert type(info.value) is expected
    assert info.value.provider == NAME
    assert info.value.retry_after_s is None


def test_error_before_message_start() -> None:
    parser = AnthropicStreamParser(NAME)
    with pytest.raises(UpstreamOverloaded):
        parser.feed(
            SSEEvent(
                data=b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
                event="error",
            )
        )


def _message_stop_end() -> int:
    return RICH.index(b'data: {"type": "message_stop"}') + len(b'data: {"type": "message_stop"}')


def test_truncated_stream_at_every_byte() -> None:
    whole_from = _message_stop_end()
    for cut in range(len(RICH) + 1):
        if cut >= whole_from:
            assert parse_chunks([RICH[:cut]]) == RICH_EVENTS, cut
            continue
        with pytest.raises(UpstreamProtocolError) as info:
            parse_chunks([RICH[:cut]])
        assert info.value.provider == NAME
        assert NAME in info.value.message


def test_stream_cut_after_an_error_event_raises_the_error_not_a_protocol_error() -> None:
    raw = start() + sse("error", error={"type": "overloaded_error", "message": "Overloaded"})
    with pytest.raises(UpstreamOverloaded):
        parse_chunks([raw])


TEXT0 = block_start(0, {"type": "text", "text": ""})


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        (b"data: {not json\n\n", "not JSON"),
        (b"data: [1, 2]\n\n", "not an object"),
        (TEXT0, "before message_start"),
        (start() + start(), "second message_start"),
        (start() + delta(0, type="text_delta", text="x"), "not open"),
        (start() + TEXT0 + stop(0) + delta(0, type="text_delta", text="x"), "not open"),
        (start() + TEXT0 + stop(0) + TEXT0, "again"),
        (start() + sse("content_block_start", index="0", content_block={"type": "text"}), "index"),
        (start() + sse("content_block_start", index=0), "content_block"),
        (start() + TEXT0 + delta(0, type="input_json_delta", partial_json="{"), "text block"),
        (start() + tool(0, "t", "f") + delta(0, type="text_delta", text="x"), "tool_use block"),
        (start() + TEXT0 + delta(0, type="text_delta", text=5), "not a string"),
        (
            start() + block_start(0, {"type": "tool_use", "id": "", "name": "f", "input": {}}),
            "id or a name",
        ),
        (start() + sse("message_delta", delta={}, usage={}) + sse("message_stop"), "stop_reason"),
        (start() + sse("message_delta", usage={}), "delta"),
        (start() + end() + sse("ping"), "after message_stop"),
        (sse("message_start"), "message"),
    ],
)
def test_malformed_streams(raw: bytes, what: str) -> None:
    with pytest.raises(UpstreamProtocolError) as info:
        parse_chunks([raw])
    assert what in info.value.message
    assert info.value.provider == NAME


def test_tool_calls_are_bounded() -> None:
    calls = b"".join(tool(i, f"t{i}", "f") + stop(i) for i in range(MAX_TOOL_CALLS))
    events = parse_chunks([start() + calls + end("tool_use")])
    assert sum(isinstance(e, ToolCallDone) for e in events) == MAX_TOOL_CALLS
    one_more = tool(MAX_TOOL_CALLS, "t", "f")
    with pytest.raises(UpstreamProtocolError, match="tool calls"):
        parse_chunks([start() + calls + one_more])


def test_open_blocks_are_bounded() -> None:
    opened = b"".join(block_start(i, {"type": "text", "text": ""}) for i in range(MAX_OPEN_BLOCKS))
    with pytest.raises(UpstreamProtocolError, match="open at once"):
        parse_chunks([start() + opened + block_start(MAX_OPEN_BLOCKS, {"type": "text"})])


def test_tool_arguments_are_bounded() -> None:
    big = "x" * 4096
    fragments = b"".join(delta(0, type="input_json_delta", partial_json=big) for _ in range(260))
    with pytest.raises(UpstreamProtocolError, match="exceed"):
        parse_chunks([start() + tool(0, "t", "f") + fragments])


# --- whole answers -----------------------------------------------------------------------------


def test_parse_whole_message() -> None:
    message = at.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [
                {"type": "thinking", "thinking": "Hmm.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "abc"},
                {"type": "text", "text": "Answer."},
                {"type": "text", "text": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1, "é"]}},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 7, "output_tokens": 30, "cache_read_input_tokens": 2},
        }
    )
    dialect = AnthropicDialect()
    assert dialect.parse_whole(NAME, message.model_dump_json().encode()) == [
        ResponseStarted(NAME),
        ReasoningDelta("Hmm."),
        TextDelta("Answer."),
        ToolCallDelta(0, "toolu_1", "f", '{"a": [1, "é"]}'),
        ToolCallDone(0, "toolu_1", "f", {"a": [1, "é"]}, '{"a": [1, "é"]}', True),
        Usage(9, 30, None, 2),
        ResponseDone("tool_calls"),
    ]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"not json", UpstreamProtocolError),
        (b"[]", UpstreamProtocolError),
        (b'{"type": "message", "stop_reason": "end_turn"}', UpstreamProtocolError),
        (b'{"type": "message", "content": [], "stop_reason": null}', UpstreamProtocolError),
        (
            b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
            UpstreamOverloaded,
        ),
    ],
)
def test_parse_whole_failures(body: bytes, expected: type[GatewayError]) -> None:
    with pytest.raises(GatewayError) as info:
        parse_whole(NAME, body)
    assert type(info.value) is expected
    assert info.value.provider == NAME


# --- errors ------------------------------------------------------------------------------------


def error_body(kind: str, message: str, **extra: Any) -> bytes:
    error = {"type": kind, "message": message, **extra}
    return json.dumps({"type": "error", "error": error, "request_id": "req_011"}).encode()


@pytest.mark.parametrize(
    ("status", "body", "headers", "expected", "retry_after_s", "param"),
    [
        (
            400,
            error_body(
                "invalid_request_error", "prompt is too long: 208656 tokens > 200000 maximum"
            ),
            {},
            ContextLengthExceeded,
            None,
            "messages",
        ),
        (
            400,
            error_body(
                "invalid_request_error",
                "input length and `max_tokens` exceed context limit: 197626 + 8192 > 200000, "
                "decrease input length or `max_tokens` and try again",
            ),
            {},
            ContextLengthExceeded,
            None,
            "messages",
        ),
        (
            400,
            error_body("invalid_request_error", "messages: roles must alternate"),
            {},
            InvalidRequest,
            None,
            None,
        ),
        (
            400,
            error_body(
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
                "Billing to upgrade or purchase credits.",
            ),
            {},
            QuotaExhausted,
            None,
            None,
        ),
        (
            400,
            error_body(
                "invalid_request_error",
                "limit",
                details={"error_code": "enforced_spend_limit_reached"},
            ),
            {},
            QuotaExhausted,
            None,
            None,
        ),
        (402, error_body("billing_error", "payment required"), {}, QuotaExhausted, None, None),
        (403, error_body("billing_error", "billing problem"), {}, QuotaExhausted, None, None),
        (
            401,
            error_body("authentication_error", "invalid x-api-key"),
            {},
            UpstreamAuthFailed,
            None,
            None,
        ),
        (
            403,
            error_body("permission_error", "no access to this model"),
            {},
            UpstreamAuthFailed,
            None,
            None,
        ),
        (
            404,
            error_body("not_found_error", "model: claude-nope-1"),
            {},
            UpstreamServerError,
            None,
            None,
        ),
        (
            413,
            error_body("request_too_large", "Request exceeds the maximum allowed number of bytes."),
            {},
            InvalidRequest,
            None,
            None,
        ),
        (
            429,
            error_body(
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
            ),
            {"retry-after": "17"},
            UpstreamRateLimited,
            17.0,
            None,
        ),
        (429, error_body("rate_limit_error", "slow down"), {}, UpstreamRateLimited, None, None),
        (
            529,
            error_body("overloaded_error", "Overloaded"),
            {"retry-after": "3"},
            UpstreamOverloaded,
            3.0,
            None,
        ),
        (
            529,
            error_body("overloaded_error", "Overloaded"),
            {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"},
            UpstreamOverloaded,
            None,
            None,
        ),
        (
            500,
            error_body("api_error", "Internal server error"),
            {},
            UpstreamServerError,
            None,
            None,
        ),
        (504, error_body("timeout_error", "Request timed out"), {}, UpstreamTimeout, None, None),
        (502, b"<html>Bad gateway</html>", {}, UpstreamServerError, None, None),
        (503, b"", {"retry-after": "5"}, UpstreamServerError, 5.0, None),
        (302, b"", {}, UpstreamProtocolError, None, None),
    ],
)
def test_classify_error(
    status: int,
    body: bytes,
    headers: dict[str, str],
    expected: type[GatewayError],
    retry_after_s: float | None,
    param: str | None,
) -> None:
    error = AnthropicDialect().classify_error(NAME, status, body, headers)
    assert type(error) is expected
    assert error.provider == NAME
    assert error.retry_after_s == retry_after_s
    assert error.param == param


def test_classified_messages() -> None:
    def message(status: int, body: bytes) -> str:
        return classify_error(NAME, status, body, {}).message

    assert message(400, error_body("invalid_request_error", "messages: roles must alternate")) == (
        "messages: roles must alternate"
    )
    assert "claude-nope-1" in message(404, error_body("not_found_error", "model: claude-nope-1"))
    assert "<html>Bad gateway</html>" in message(502, b"<html>Bad gateway</html>")
    assert "(empty body)" in message(503, b"")
    assert message(400, error_body("invalid_request_error", "prompt is too long: 2 > 1")) == (
        "prompt is too long: 2 > 1"
    )


def test_auth_failure_never_repeats_the_upstreams_words() -> None:
    body = error_body("authentication_error", "invalid x-api-key: sk-ant-api03-SECRET")
    error = classify_error(NAME, 401, body, {})
    assert error.message == (
        "claude-a: anthropic rejected the gateway's credential "
        "(answered HTTP 401, authentication_error)"
    )
    assert "SECRET" not in json.dumps(error.to_body())


def test_upstream_messages_that_quote_a_key_are_redacted() -> None:
    key = "sk-ant-api03-" + "A" * 40
    for status, body in (
        (400, error_body("invalid_request_error", f"bad header x-api-key: {key}")),
        (502, f"proxy says: {key}".encode()),
    ):
        error = classify_error(NAME, status, body, {})
        assert key not in error.message
        assert "[redacted]" in error.message
