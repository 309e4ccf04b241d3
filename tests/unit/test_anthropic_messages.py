"""The anthropic dialect's request translation, the conversation: system and developer
messages, user parts (text, images, documents), tool calls and results, merged turns, and
the messages it refuses. Every body is checked against the ``anthropic`` SDK's TypedDicts."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.anthropic_helpers import (
    PDF,
    PNG,
    TIME_TOOL,
    USER,
    WEATHER_TOOL,
    conversation_with_tools,
    translate,
)
from trio_gateway.core.errors import (
    GatewayError,
    InvalidRequest,
    UnsupportedParameter,
)
from trio_gateway.providers.anthropic.request import LEADING_USER_TEXT


def test_minimal_body() -> None:
    assert translate({"messages": [USER]}) == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "stream": True,
    }


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
