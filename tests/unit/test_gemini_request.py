"""The gemini and vertex dialects' request apart from the messages: that the SDK's models do
reject unknown names, URLs and credentials, tools and tool_choice, the generation config
(thinking included), the fields dropped, stripped or refused, and the seed."""

from __future__ import annotations

import json
from typing import Any

import google.genai.types as gtypes
import pydantic
import pytest

from tests.unit.gemini_helpers import (
    GEMINI,
    PLAIN,
    USER,
    VERTEX,
    WEATHER_SCHEMA,
    WEATHER_TOOL,
    body_for,
    check_with_sdk,
)
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import (
    UnsupportedParameter,
)
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.gemini.dialect import (
    GeminiDialect,
    VertexDialect,
)
from trio_gateway.providers.gemini.request import (
    DROPPED_FIELDS,
    int32_seed,
)


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
