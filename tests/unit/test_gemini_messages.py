"""The gemini dialect's request translation, the conversation: messages to ``contents`` and
``systemInstruction`` (parts, images, tool calls and results), the messages it refuses, and
every case at once with every parameter, judged by Google's SDK."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.gemini_helpers import (
    CALL,
    GEMINI,
    PLAIN,
    USER,
    VERTEX,
    WEATHER_TOOL,
    check_with_sdk,
)
from trio_gateway.core.errors import (
    GatewayError,
    InvalidRequest,
    UnsupportedParameter,
)
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.gemini.request import (
    SKIP_SIGNATURE,
    build_body,
)

MESSAGE_CASES: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
    (
        "system and developer anywhere -> systemInstruction, in order",
        [
            {"role": "system", "content": "be brief"},
            USER,
            {"role": "developer", "content": [{"type": "text", "text": "no emoji"}]},
        ],
        {
            "systemInstruction": {"parts": [{"text": "be brief"}, {"text": "no emoji"}]},
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        },
    ),
    (
        "assistant -> model; consecutive users merged; empty text dropped; name dropped",
        [
            {"role": "user", "content": "a", "name": "ann"},
            {
                "role": "user",
                "content": [{"type": "text", "text": ""}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": ""},
            {"role": "user", "content": "d"},
        ],
        {
            "contents": [
                {"role": "user", "parts": [{"text": "a"}, {"text": "b"}]},
                {"role": "model", "parts": [{"text": "c"}]},
                {"role": "user", "parts": [{"text": "d"}]},
            ]
        },
    ),
    (
        "images: data URL -> inlineData, http(s) URL -> fileData with a guessed type",
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/webp;base64,UklGRg=="}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a/cat.PNG?s=1"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/img/123"}},
                    {
                        "type": "image_url",
                        "image_url": {"url": "http://x.test/b.jpeg", "detail": "low"},
                    },
                ],
            }
        ],
        {
            "contents": [
                {
                    "role": "user",
                    "parts": [
                        {"inlineData": {"mimeType": "image/webp", "data": "UklGRg=="}},
                        {
                            "fileData": {
                                "mimeType": "image/png",
                                "fileUri": "https://x.test/a/cat.PNG?s=1",
                            }
                        },
                        {
                            "fileData": {
                                "mimeType": "image/jpeg",
                                "fileUri": "https://x.test/img/123",
                            }
                        },
                        {"fileData": {"mimeType": "image/jpeg", "fileUri": "http://x.test/b.jpeg"}},
                    ],
                }
            ]
        },
    ),
    (
        "audio and PDF files -> inlineData",
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                    {"type": "file", "file": {"file_data": "JVBERi0x"}},
                ],
            }
        ],
        {
            "contents": [
                {
                    "role": "user",
                    "parts": [
                        {"inlineData": {"mimeType": "audio/wav", "data": "UklGRg=="}},
                        {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0x"}},
                    ],
                }
            ]
        },
    ),
    (
        "tool calls -> functionCall (signed for Gemini 3); results -> functionResponse, merged",
        [
            USER,
            {
                "role": "assistant",
                "content": "checking",
                "tool_calls": [
                    CALL,
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "now", "arguments": ""},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
            {
                "role": "tool",
                "tool_call_id": "call_2",
                "content": [{"type": "text", "text": "noon"}],
            },
            {"role": "user", "content": "thanks"},
        ],
        {
            "contents": [
                {"role": "user", "parts": [{"text": "hi"}]},
                {
                    "role": "model",
                    "parts": [
                        {"text": "checking"},
                        {
                            "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                            "thoughtSignature": SKIP_SIGNATURE,
                        },
                        {
                            "functionCall": {"name": "now", "args": {}},
                            "thoughtSignature": SKIP_SIGNATURE,
                        },
                    ],
                },
                {
                    "role": "user",
                    "parts": [
                        {"functionResponse": {"name": "get_weather", "response": {"temp": 21}}},
                        {"functionResponse": {"name": "now", "response": {"output": "noon"}}},
                        {"text": "thanks"},
                    ],
                },
            ]
        },
    ),
    (
        "a tool result that is JSON but not an object, or not JSON, is {output: text}",
        [
            USER,
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "[1, 2]"},
            {"role": "tool", "tool_call_id": "call_1", "content": "{not json"},
        ],
        {
            "contents": [
                {"role": "user", "parts": [{"text": "hi"}]},
                {
                    "role": "model",
                    "parts": [
                        {
                            "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                            "thoughtSignature": SKIP_SIGNATURE,
                        }
                    ],
                },
                {
                    "role": "user",
                    "parts": [
                        {
                            "functionResponse": {
                                "name": "get_weather",
                                "response": {"output": "[1, 2]"},
                            }
                        },
                        {
                            "functionResponse": {
                                "name": "get_weather",
                                "response": {"output": "{not json"},
                            }
                        },
                    ],
                },
            ]
        },
    ),
    (
        "an assistant refusal is what it said",
        [USER, {"role": "assistant", "content": None, "refusal": "I can't"}],
        {
            "contents": [
                {"role": "user", "parts": [{"text": "hi"}]},
                {"role": "model", "parts": [{"text": "I can't"}]},
            ]
        },
    ),
]


@pytest.mark.parametrize(
    ("messages", "expected"),
    [case[1:] for case in MESSAGE_CASES],
    ids=[case[0] for case in MESSAGE_CASES],
)
def test_messages(messages: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    request = validate_chat_body({"model": "alias", "messages": messages})
    body = build_body(request, PLAIN)
    assert body == expected
    check_with_sdk(body)


MESSAGE_ERRORS: list[tuple[list[dict[str, Any]], type[GatewayError], str]] = [
    (
        [
            USER,
            {
                "role": "assistant",
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{x"}}],
            },
        ],
        InvalidRequest,
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        [
            USER,
            {
                "role": "assistant",
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1]"}}],
            },
        ],
        InvalidRequest,
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        [USER, {"role": "tool", "tool_call_id": "nobody", "content": "x"}],
        InvalidRequest,
        "messages[1].tool_call_id",
    ),
    ([{"role": "system", "content": "only rules"}], InvalidRequest, "messages"),
    ([{"role": "function", "name": "f", "content": "x"}], UnsupportedParameter, "messages[0].role"),
    (
        [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}],
        UnsupportedParameter,
        "messages[0].content[0].file",
    ),
    (
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,%%"}}
                ],
            }
        ],
        InvalidRequest,
        "messages[0].content[0].image_url.url",
    ),
    (
        [
            USER,
            {
                "role": "assistant",
                "content": "x",
                "function_call": {"name": "f", "arguments": "{}"},
            },
        ],
        UnsupportedParameter,
        "messages[1].function_call",
    ),
]


@pytest.mark.parametrize(("messages", "error", "param"), MESSAGE_ERRORS)
def test_message_errors(
    messages: list[dict[str, Any]], error: type[GatewayError], param: str
) -> None:
    request = validate_chat_body({"model": "alias", "messages": messages})
    with pytest.raises(error) as caught:
        build_body(request, GEMINI)
    assert caught.value.param == param


def test_a_full_request_passes_the_sdk() -> None:
    messages = [m for case in MESSAGE_CASES for m in case[1]]
    request = validate_chat_body(
        {
            "model": "alias",
            "messages": messages,
            "tools": [WEATHER_TOOL, {"type": "function", "function": {"name": "now"}}],
            "tool_choice": "auto",
            "max_tokens": 10,
            "stop": ["x"],
            "seed": 1,
            "temperature": 0.1,
            "top_p": 0.9,
            "presence_penalty": 0.1,
            "frequency_penalty": 0.1,
            "response_format": {"type": "json_object"},
            "reasoning_effort": "minimal",
        }
    )
    for provider in (GEMINI, VERTEX, PLAIN):
        body = build_body(request, provider)
        check_with_sdk(body)
        assert body["systemInstruction"]["parts"]
        assert {c["role"] for c in body["contents"]} == {"user", "model"}
