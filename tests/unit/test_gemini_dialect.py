"""The gemini and vertex dialects' pure parts: request translation, the stream, the errors.

Request bodies are also judged by Google's own SDK: its pydantic models (``google.genai.types``)
forbid unknown fields, so a misspelt or invented name fails there as it would at Google.
"""

from __future__ import annotations

import json
from typing import Any

import google.genai.types as gtypes
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from trio_gateway.providers.gemini.dialect import (
    FINISH_REASONS,
    GeminiDialect,
    GeminiStreamParser,
    VertexDialect,
    classify_error,
    parse_whole,
)
from trio_gateway.providers.gemini.request import (
    DROPPED_FIELDS,
    SKIP_SIGNATURE,
    build_body,
    int32_seed,
)

GEMINI = ProviderConfig(
    name="gem",
    type="gemini",
    model="gemini-2.5-flash",
    api_key_env="GEMINI_KEY",
    capabilities=frozenset({Capability.REASONING, Capability.TOOLS, Capability.VISION}),
)
VERTEX = ProviderConfig(
    name="vtx",
    type="vertex",
    model="gemini-2.5-pro",
    credentials_file="/etc/sa.json",
    project="my-project",
    location="europe-west4",
    capabilities=frozenset({Capability.REASONING}),
)
PLAIN = ProviderConfig(name="old", type="gemini", model="gemini-2.0-flash", api_key_env="K")
USER = {"role": "user", "content": "hi"}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
WEATHER_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"city": {"type": ["string", "null"]}, "unit": {"const": "C"}},
    "additionalProperties": False,
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather now",
        "parameters": WEATHER_SCHEMA,
    },
}


def body_for(provider: ProviderConfig = GEMINI, **fields: Any) -> dict[str, Any]:
    request = validate_chat_body({"model": "alias", "messages": [USER], **fields})
    return build_body(request, provider)


def check_with_sdk(body: dict[str, Any]) -> None:
    """Every part of a request body, through the SDK's models (unknown names are errors)."""
    assert set(body) <= {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig"}
    for content in body["contents"]:
        gtypes.Content.model_validate(content)
    if "systemInstruction" in body:
        gtypes.Content.model_validate(body["systemInstruction"])
    for tool in body.get("tools", ()):
        gtypes.Tool.model_validate(tool)
    if "toolConfig" in body:
        gtypes.ToolConfig.model_validate(body["toolConfig"])
    if "generationConfig" in body:
        gtypes.GenerationConfig.model_validate(body["generationConfig"])


def test_the_sdk_models_do_reject_unknown_names() -> None:
    with pytest.raises(pydantic.ValidationError):
        gtypes.GenerationConfig.model_validate({"maxTokens": 5})
    with pytest.raises(pydantic.ValidationError):
        gtypes.Part.model_validate({"text": "x", "cache_control": {}})


# --- URLs and credentials ----------------------------------------------------------------------


def test_urls_and_auth_headers() -> None:
    request = validate_chat_body({"model": "alias", "messages": [USER]})
    call = GeminiDialect().build_call(request, GEMINI)
    assert call.url == (
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash"
        ":streamGenerateContent?alt=sse"
    )
    assert call.headers["content-type"] == "application/json"
    assert json.loads(call.body) == {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generationConfig": {"thinkingConfig": {"includeThoughts": True}},
    }
    vertex = VertexDialect().build_call(request, VERTEX)
    assert vertex.url == (
        "https://europe-west4-aiplatform.googleapis.com/v1/projects/my-project/locations/"
        "europe-west4/publishers/google/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    )
    assert GeminiDialect().auth_headers("AIzaKEY") == {"x-goog-api-key": "AIzaKEY"}
    assert VertexDialect().auth_headers("ya29.tok") == {"authorization": "Bearer ya29.tok"}


def test_url_with_a_base_url_and_a_models_prefix() -> None:
    provider = ProviderConfig(
        name="sim",
        type="gemini",
        model="models/m-1",
        base_url="http://127.0.0.1:9/",
        api_key_env="K",
    )
    request = validate_chat_body({"model": "alias", "messages": [USER]})
    url = GeminiDialect().build_call(request, provider).url
    assert url == "http://127.0.0.1:9/v1beta/models/m-1:streamGenerateContent?alt=sse"


# --- messages ----------------------------------------------------------------------------------

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


# --- tools -------------------------------------------------------------------------------------


def test_tools_keep_the_json_schema_as_given() -> None:
    bare = {"type": "function", "function": {"name": "now", "strict": True}}
    body = body_for(tools=[WEATHER_TOOL, bare], parallel_tool_calls=False)
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "Weather now",
                    "parametersJsonSchema": WEATHER_SCHEMA,
                },
                {"name": "now"},
            ]
        }
    ]
    assert "toolConfig" not in body
    check_with_sdk(body)


@pytest.mark.parametrize(
    ("choice", "config"),
    [
        ("auto", {"mode": "AUTO"}),
        ("none", {"mode": "NONE"}),
        ("required", {"mode": "ANY"}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"mode": "ANY", "allowedFunctionNames": ["get_weather"]},
        ),
    ],
)
def test_tool_choice(choice: object, config: dict[str, Any]) -> None:
    body = body_for(tools=[WEATHER_TOOL], tool_choice=choice)
    assert body["toolConfig"] == {"functionCallingConfig": config}
    check_with_sdk(body)


def test_tool_choice_none_without_tools_sends_nothing() -> None:
    assert "toolConfig" not in body_for(tool_choice="none")


# --- generation config -------------------------------------------------------------------------

GENERATION_CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"max_tokens": 100}, {"maxOutputTokens": 100}),
    ({"max_completion_tokens": 50, "max_tokens": 100}, {"maxOutputTokens": 50}),
    ({"temperature": 1.5, "top_p": 0.5}, {"temperature": 1.5, "topP": 0.5}),
    ({"top_k": 40}, {"topK": 40}),
    ({"top_k": -1}, {}),
    ({"stop": "END"}, {"stopSequences": ["END"]}),
    ({"stop": ["a", "b"]}, {"stopSequences": ["a", "b"]}),
    ({"seed": 7}, {"seed": 7}),
    ({"seed": 2**31}, {"seed": -(2**31)}),
    (
        {"presence_penalty": 0.5, "frequency_penalty": -0.5},
        {"presencePenalty": 0.5, "frequencyPenalty": -0.5},
    ),
    ({"n": 1}, {}),
    ({"response_format": {"type": "text"}}, {}),
    ({"response_format": {"type": "json_object"}}, {"responseMimeType": "application/json"}),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "out",
                    "strict": True,
                    "schema": {"type": "object", "additionalProperties": False},
                },
            }
        },
        {
            "responseMimeType": "application/json",
            "responseJsonSchema": {"type": "object", "additionalProperties": False},
        },
    ),
]


@pytest.mark.parametrize(("fields", "config"), GENERATION_CASES)
def test_generation_config(fields: dict[str, Any], config: dict[str, Any]) -> None:
    body = body_for(PLAIN, **fields)
    assert body.get("generationConfig", {}) == config
    check_with_sdk(body)


@pytest.mark.parametrize(
    ("fields", "thinking"),
    [
        ({}, {"includeThoughts": True}),
        ({"reasoning": False}, {"thinkingBudget": 0}),
        ({"reasoning_effort": "none"}, {"thinkingBudget": 0}),
        ({"reasoning": True}, {"includeThoughts": True, "thinkingBudget": 8192}),
        ({"reasoning_effort": "low"}, {"includeThoughts": True, "thinkingBudget": 2048}),
        ({"reasoning_effort": "high"}, {"includeThoughts": True, "thinkingBudget": 16384}),
    ],
)
def test_thinking(fields: dict[str, Any], thinking: dict[str, Any]) -> None:
    body = body_for(GEMINI, **fields)
    assert body["generationConfig"]["thinkingConfig"] == thinking
    check_with_sdk(body)
    # A model configured without the reasoning capability never gets a thinkingConfig.
    assert "thinkingConfig" not in body_for(PLAIN, **fields).get("generationConfig", {})


def test_dropped_fields_are_never_sent() -> None:
    fields = {
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u-1",
        "metadata": {"k": "v"},
        "store": True,
        "service_tier": "auto",
        "logit_bias": {"50256": -100},
        "logprobs": False,
        "safety_identifier": "s",
        "prompt_cache_key": "k",
        "verbosity": "low",
        "modalities": ["text"],
        "vllm_only_knob": 3,
    }
    assert set(fields) - {"vllm_only_knob"} <= DROPPED_FIELDS
    assert body_for(PLAIN, **fields) == {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def test_strip_fields_and_refused_fields() -> None:
    stripping = ProviderConfig(
        name="s", type="gemini", model="m", api_key_env="K", strip_fields=("presence_penalty",)
    )
    body = body_for(stripping, presence_penalty=1.0, temperature=0.5)
    assert body["generationConfig"] == {"temperature": 0.5}
    with pytest.raises(UnsupportedParameter) as caught:
        body_for(functions=[{"name": "f"}])
    assert caught.value.param == "functions"
    with pytest.raises(UnsupportedParameter):
        body_for(modalities=["text", "audio"])


def test_int32_seed() -> None:
    assert int32_seed(0) == 0
    assert int32_seed(2**31 - 1) == 2**31 - 1
    assert int32_seed(-(2**31)) == -(2**31)
    assert int32_seed(2**63 - 1) == -1
    assert all(-(2**31) <= int32_seed(s) < 2**31 for s in (2**40 + 3, -(2**63)))


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


# --- the stream --------------------------------------------------------------------------------


def frame(value: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(value).encode() + b"\r\n\r\n"


def chunk(
    *parts: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-2.5-flash"}
    if usage is not None:
        out["usageMetadata"] = usage
    return out


def run(raw: bytes, splits: list[int] | None = None) -> list[Event]:
    decoder = SSEDecoder()
    parser = GeminiStreamParser("gem")
    pieces = []
    start = 0
    for cut in sorted(splits or []):
        pieces.append(raw[start:cut])
        start = cut
    pieces.append(raw[start:])
    events: list[Event] = []
    for piece in pieces:
        for sse in decoder.feed(piece):
            events += parser.feed(sse)
            if parser.done:
                return events
    for sse in decoder.close():
        events += parser.feed(sse)
    return events + parser.close()


THINKING_STREAM = b"".join(
    [
        frame(chunk({"text": "Let me think", "thought": True}, usage={"promptTokenCount": 12})),
        frame(
            chunk({"text": " about it.", "thought": True}, {"text": "", "thoughtSignature": "c2ln"})
        ),
        frame(
            chunk({"text": "Bonjour "}, usage={"promptTokenCount": 12, "candidatesTokenCount": 1})
        ),
        frame(
            chunk(
                {"text": "le monde"},
                finish="STOP",
                usage={
                    "promptTokenCount": 12,
                    "cachedContentTokenCount": 8,
                    "candidatesTokenCount": 4,
                    "thoughtsTokenCount": 30,
                    "totalTokenCount": 46,
                },
            )
        ),
    ]
)
THINKING_EVENTS: list[Event] = [
    ResponseStarted("gem"),
    ReasoningDelta("Let me think"),
    ReasoningDelta(" about it."),
    TextDelta("Bonjour "),
    TextDelta("le monde"),
    Usage(prompt_tokens=12, completion_tokens=34, reasoning_tokens=30, cached_tokens=8),
    ResponseDone("stop"),
]


def test_thought_parts_are_reasoning_and_usage_is_the_last() -> None:
    assert run(THINKING_STREAM) == THINKING_EVENTS


@settings(max_examples=200, deadline=None)
@given(splits=st.lists(st.integers(0, len(THINKING_STREAM)), max_size=12))
def test_any_byte_split_gives_the_same_events(splits: list[int]) -> None:
    assert run(THINKING_STREAM, splits) == THINKING_EVENTS


def test_done_when_finish_and_usage_arrive() -> None:
    parser = GeminiStreamParser("gem")
    parser.feed(SSEEvent(json.dumps(chunk({"text": "a"})).encode()))
    assert not parser.done
    events = parser.feed(
        SSEEvent(json.dumps(chunk(finish="STOP", usage={"promptTokenCount": 1})).encode())
    )
    assert parser.done
    assert events[-1] == ResponseDone("stop")
    assert parser.close() == []
    with pytest.raises(UpstreamProtocolError):
        parser.feed(SSEEvent(b'{"candidates": []}'))


def test_two_function_calls_get_unique_ids_and_finish_tool_calls() -> None:
    raw = frame(
        chunk(
            {
                "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                "thoughtSignature": "c2ln",
            },
            {"functionCall": {"name": "now"}},
            finish="STOP",
            usage={"promptTokenCount": 5, "candidatesTokenCount": 9},
        )
    )
    events = run(raw)
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    done = [e for e in events if isinstance(e, ToolCallDone)]
    assert [(d.index, d.name, d.arguments) for d in deltas] == [
        (0, "get_weather", '{"city": "Paris"}'),
        (1, "now", "{}"),
    ]
    assert all(d.id and d.id.startswith("call_") for d in deltas)
    assert len({d.id for d in deltas}) == 2
    assert [(d.id, d.name, d.arguments, d.arguments_valid) for d in done] == [
        (deltas[0].id, "get_weather", {"city": "Paris"}, True),
        (deltas[1].id, "now", {}, True),
    ]
    assert events[-2:] == [Usage(5, 9), ResponseDone("tool_calls")]
    # Fresh ids for every answer.
    again = [e for e in run(raw) if isinstance(e, ToolCallDelta)]
    assert {d.id for d in again}.isdisjoint({d.id for d in deltas})


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("RECITATION", "content_filter"),
        ("BLOCKLIST", "content_filter"),
        ("PROHIBITED_CONTENT", "content_filter"),
        ("SPII", "content_filter"),
        ("OTHER", "stop"),
        ("MALFORMED_FUNCTION_CALL", "stop"),
        ("SOMETHING_NEW", "stop"),
    ],
)
def test_finish_reasons(reason: str, finish: str) -> None:
    events = run(frame(chunk({"text": "x"}, finish=reason, usage={"promptTokenCount": 1})))
    assert events[-1] == ResponseDone(finish)
    assert FINISH_REASONS.get(reason, "stop") == finish


def test_usage_after_the_finishing_chunk_is_waited_for() -> None:
    raw = frame(chunk({"text": "x"}, finish="MAX_TOKENS")) + frame(
        {"usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 7}}
    )
    assert run(raw) == [
        ResponseStarted("gem"),
        TextDelta("x"),
        Usage(3, 7),
        ResponseDone("length"),
    ]


def test_a_finish_without_usage_ends_at_the_close() -> None:
    parser = GeminiStreamParser("gem")
    parser.feed(SSEEvent(json.dumps(chunk({"text": "x"}, usage={"promptTokenCount": 2})).encode()))
    parser.feed(SSEEvent(json.dumps(chunk(finish="STOP")).encode()))
    assert not parser.done
    assert parser.close() == [Usage(2, 0), ResponseDone("stop")]


def test_a_truncated_stream_is_a_protocol_error() -> None:
    raw = frame(chunk({"text": "half"}, usage={"promptTokenCount": 2}))
    with pytest.raises(UpstreamProtocolError, match="before the answer finished"):
        run(raw)
    # Cut inside a frame: the decoder hands over a half JSON object.
    with pytest.raises(UpstreamProtocolError):
        run(THINKING_STREAM[:-20])


def test_an_error_mid_stream_is_raised_from_feed() -> None:
    error = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    raw = frame(chunk({"text": "a"})) + frame(error)
    with pytest.raises(UpstreamOverloaded, match="overloaded"):
        run(raw)
    quota = {"error": {"message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}}
    with pytest.raises(UpstreamRateLimited):
        run(frame(quota))


def test_a_blocked_prompt_is_a_content_filter_answer() -> None:
    raw = frame(
        {
            "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
            "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
        }
    )
    parser = GeminiStreamParser("gem")
    events = parser.feed(SSEDecoder().feed(raw)[0])
    assert parser.done
    assert events == [ResponseStarted("gem"), Usage(9, 0), ResponseDone("content_filter")]


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1]",
        b'{"candidates": {}}',
        b'{"candidates": [{"content": {"parts": [{"text": 5}]}}]}',
        b'{"candidates": [{"content": {"parts": [{"functionCall": {"args": {}}}]}}]}',
        b'{"candidates": [{"finishReason": 3}]}',
    ],
)
def test_malformed_chunks(payload: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        GeminiStreamParser("gem").feed(SSEEvent(payload))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
PARTS = st.fixed_dictionaries(
    {},
    optional={
        "text": JSON,
        "thought": JSON,
        "functionCall": st.fixed_dictionaries({}, optional={"name": JSON, "args": JSON}),
    },
)
CHUNKS = st.fixed_dictionaries(
    {},
    optional={
        "candidates": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "content": st.fixed_dictionaries(
                        {}, optional={"parts": st.lists(PARTS, max_size=3)}
                    ),
                    "finishReason": st.sampled_from(["STOP", "MAX_TOKENS", "SAFETY"]) | JSON,
                },
            ),
            max_size=2,
        ),
        "usageMetadata": st.dictionaries(
            st.sampled_from(["promptTokenCount", "candidatesTokenCount", "thoughtsTokenCount"]),
            JSON,
        ),
        "promptFeedback": JSON,
        "error": JSON,
    },
)


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(CHUNKS, max_size=4))
def test_any_chunks_give_events_or_a_gateway_error(chunks: list[dict[str, Any]]) -> None:
    parser = GeminiStreamParser("gem")
    try:
        for value in chunks:
            if parser.done:
                break
            parser.feed(SSEEvent(json.dumps(value).encode()))
        parser.close()
    except GatewayError:
        pass


def test_parse_whole() -> None:
    body = chunk(
        {"text": "hm", "thought": True},
        {"text": "yes"},
        {"functionCall": {"name": "f", "args": {"a": [1]}}},
        finish="STOP",
        usage={"promptTokenCount": 4, "candidatesTokenCount": 2, "thoughtsTokenCount": 1},
    )
    events = parse_whole("gem", json.dumps(body).encode())
    assert [type(e).__name__ for e in events] == [
        "ResponseStarted",
        "ReasoningDelta",
        "TextDelta",
        "ToolCallDelta",
        "ToolCallDone",
        "Usage",
        "ResponseDone",
    ]
    assert events[-2:] == [Usage(4, 3, reasoning_tokens=1), ResponseDone("tool_calls")]
    # streamGenerateContent without alt=sse: a JSON array of the chunks.
    array = [
        chunk({"text": "a"}),
        chunk({"text": "b"}, finish="STOP", usage={"promptTokenCount": 1}),
    ]
    texts = [
        e.text for e in parse_whole("gem", json.dumps(array).encode()) if isinstance(e, TextDelta)
    ]
    assert texts == ["a", "b"]
    with pytest.raises(UpstreamProtocolError):
        parse_whole("gem", b"<html>")
    with pytest.raises(InvalidRequest):
        parse_whole(
            "gem", b'{"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}'
        )


# --- errors ------------------------------------------------------------------------------------


def google_error(
    code: int, status: str, message: str, *details: dict[str, Any], wrap: bool = False
) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = list(details)
    value: Any = {"error": error}
    return json.dumps([value] if wrap else value).encode()


def retry_info(delay: str) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}


def quota_failure(*quota_ids: str, value: str | None = None) -> dict[str, Any]:
    violations = []
    for quota_id in quota_ids:
        violation = {
            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
            "quotaId": quota_id,
            "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"},
        }
        if value is not None:
            violation["quotaValue"] = value
        violations.append(violation)
    return {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": violations}


FREE_TIER = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits."
)
API_KEY_INVALID = {
    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
    "reason": "API_KEY_INVALID",
    "domain": "googleapis.com",
}
ERROR_ROWS: list[tuple[str, int, bytes, dict[str, str], type[GatewayError], float | None]] = [
    (
        "context length",
        400,
        google_error(
            400,
            "INVALID_ARGUMENT",
            "The input token count (3475108) exceeds the maximum number of tokens allowed "
            "(1048576).",
        ),
        {},
        ContextLengthExceeded,
        None,
    ),
    (
        "context length, vertex wording",
        400,
        google_error(
            400,
            "INVALID_ARGUMENT",
            "Unable to submit request because the input token count is 1048577 but model only "
            "supports up to 1048576. Reduce the input token count and try again.",
        ),
        {},
        ContextLengthExceeded,
        None,
    ),
    (
        "invalid argument",
        400,
        google_error(400, "INVALID_ARGUMENT", 'Invalid JSON payload received. Unknown name "x"'),
        {},
        InvalidRequest,
        None,
    ),
    (
        "failed precondition",
        400,
        google_error(400, "FAILED_PRECONDITION", "Function calling is not enabled for this model"),
        {},
        InvalidRequest,
        None,
    ),
    (
        "unsupported location: this provider's lot",
        400,
        google_error(400, "FAILED_PRECONDITION", "User location is not supported for the API use."),
        {},
        UpstreamServerError,
        None,
    ),
    (
        "bad API key (AI Studio says 400)",
        400,
        google_error(
            400,
            "INVALID_ARGUMENT",
            "API key not valid. Please pass a valid API key.",
            API_KEY_INVALID,
        ),
        {},
        UpstreamAuthFailed,
        None,
    ),
    (
        "unauthenticated",
        401,
        google_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials."),
        {},
        UpstreamAuthFailed,
        None,
    ),
    (
        "permission denied",
        403,
        google_error(403, "PERMISSION_DENIED", "Permission denied on resource project my-project."),
        {},
        UpstreamAuthFailed,
        None,
    ),
    (
        "model not found",
        404,
        google_error(404, "NOT_FOUND", "models/gemini-9 is not found for API version v1beta"),
        {},
        UpstreamServerError,
        None,
    ),
    (
        "rate limit, RetryInfo 4s",
        429,
        google_error(
            429,
            "RESOURCE_EXHAUSTED",
            FREE_TIER,
            quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier"),
            retry_info("4s"),
        ),
        {},
        UpstreamRateLimited,
        4.0,
    ),
    (
        "rate limit, RetryInfo 1.5s, as an array",
        429,
        google_error(
            429, "RESOURCE_EXHAUSTED", "Resource exhausted", retry_info("1.5s"), wrap=True
        ),
        {},
        UpstreamRateLimited,
        1.5,
    ),
    (
        "rate limit, the header wins over the body",
        429,
        google_error(429, "RESOURCE_EXHAUSTED", "Resource exhausted", retry_info("30s")),
        {"retry-after": "7"},
        UpstreamRateLimited,
        7.0,
    ),
    (
        "rate limit, delay only in the message",
        429,
        google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded. Please retry in 2.5s."),
        {},
        UpstreamRateLimited,
        2.5,
    ),
    (
        "vertex shared quota: a rate limit with no hint",
        429,
        google_error(429, "RESOURCE_EXHAUSTED", "Resource exhausted. Please try again later."),
        {},
        UpstreamRateLimited,
        None,
    ),
    (
        "daily quota: exhausted, whatever RetryInfo says",
        429,
        google_error(
            429,
            "RESOURCE_EXHAUSTED",
            FREE_TIER,
            quota_failure(
                "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
            ),
            retry_info("20s"),
        ),
        {},
        QuotaExhausted,
        None,
    ),
    (
        "a quota of 0: exhausted",
        429,
        google_error(
            429,
            "RESOURCE_EXHAUSTED",
            FREE_TIER + " Quota exceeded for metric: x, limit: 0, model: gemini-2.5-pro",
            quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", value="0"),
            retry_info("10s"),
        ),
        {},
        QuotaExhausted,
        None,
    ),
    (
        "over quota with no details: exhausted",
        429,
        google_error(429, "RESOURCE_EXHAUSTED", FREE_TIER),
        {},
        QuotaExhausted,
        None,
    ),
    (
        "prepaid credit used up",
        429,
        google_error(429, "RESOURCE_EXHAUSTED", "Your prepayment credits are depleted."),
        {},
        QuotaExhausted,
        None,
    ),
    (
        "internal",
        500,
        google_error(500, "INTERNAL", "An internal error has occurred."),
        {},
        UpstreamServerError,
        None,
    ),
    (
        "unavailable",
        503,
        google_error(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
        {"retry-after": "3"},
        UpstreamOverloaded,
        3.0,
    ),
    (
        "deadline exceeded",
        504,
        google_error(504, "DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
        {},
        UpstreamTimeout,
        None,
    ),
    ("not JSON (a proxy's page)", 502, b"<html>Bad Gateway</html>", {}, UpstreamServerError, None),
]


@pytest.mark.parametrize(
    ("status", "body", "headers", "error", "wait"),
    [row[1:] for row in ERROR_ROWS],
    ids=[row[0] for row in ERROR_ROWS],
)
def test_classify_error(
    status: int,
    body: bytes,
    headers: dict[str, str],
    error: type[GatewayError],
    wait: float | None,
) -> None:
    for dialect in (GeminiDialect(), VertexDialect()):
        classified = dialect.classify_error("gem", status, body, headers)
        assert type(classified) is error
        assert classified.retry_after_s == wait
        assert classified.provider == "gem"
    if error is ContextLengthExceeded:
        assert classified.param == "messages"
    if error is InvalidRequest:
        assert "Invalid JSON" in classified.message or "not enabled" in classified.message


def test_credentials_in_error_messages_are_redacted() -> None:
    key = "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW"
    body = google_error(400, "INVALID_ARGUMENT", f"API key not valid: {key}", API_KEY_INVALID)
    error = classify_error("gem", 400, body, {})
    assert isinstance(error, UpstreamAuthFailed)
    assert key not in error.message and "[redacted]" in error.message
    token = "ya29.a0AfB_byC-secret.token"
    body = google_error(401, "UNAUTHENTICATED", f"bad token {token}")
    assert token not in classify_error("gem", 401, body, {}).message
    raw = f"oops {key}".encode()
    assert key not in classify_error("gem", 500, raw, {}).message
