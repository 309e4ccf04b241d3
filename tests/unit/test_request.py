"""Client request validation and capability derivation: what a user who gets it wrong sees."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import InvalidJSON, InvalidRequest, RequestError, UnsupportedParameter
from trio_gateway.core.request import parse_chat_request

MSG = [{"role": "user", "content": "hi"}]


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "agent-lite", "messages": MSG, **fields}).encode()


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [
        (b"{", InvalidJSON, "not valid JSON"),
        (b'{"model": "a",}', InvalidJSON, "line 1 column"),
        (b"\xff\xfe{}", InvalidJSON, ""),
        (
            b'{"model": "\xff"}',
            InvalidJSON,
            "request body is not UTF-8: invalid start byte at byte 11",
        ),
        (b"[]", InvalidRequest, "JSON object"),
        (b'{"model": "a", "messages": [], "temperature": NaN}', InvalidJSON, "NaN"),
        (b'{"model": "a", "temperature": -Infinity}', InvalidJSON, "-Infinity"),
        (b"[" * 100_000 + b"]" * 100_000, InvalidJSON, "not valid JSON: nested too deeply"),
        (b'{"messages": []}', InvalidRequest, "'model'"),
        (b'{"model": 3, "messages": []}', InvalidRequest, "'model'"),
        (b'{"model": "a", "messages": []}', InvalidRequest, "empty array"),
        (b'{"model": "a", "messages": ["hi"]}', InvalidRequest, "messages[0]"),
        (b'{"model": "a", "messages": [{"content": "x"}]}', InvalidRequest, "messages[0].role"),
        (body(stream="yes"), InvalidRequest, "'stream'"),
        (body(stream=True, stream_options=[]), InvalidRequest, "stream_options"),
        (
            body(stream=True, stream_options={"include_usage": 1}),
            InvalidRequest,
            "include_usage",
        ),
        (body(n=2), UnsupportedParameter, "n=1"),
        (body(logprobs=True), UnsupportedParameter, "logprobs"),
        (body(max_tokens=0), InvalidRequest, "max_tokens"),
        (body(max_tokens="8"), InvalidRequest, "max_tokens"),
        (body(max_completion_tokens=True), InvalidRequest, "max_completion_tokens"),
        (body(tools={}), InvalidRequest, "'tools'"),
        (body(response_format="json"), InvalidRequest, "response_format"),
        (body(reasoning="on"), InvalidRequest, "'reasoning'"),
        (body(reasoning_effort="max"), InvalidRequest, "reasoning_effort"),
        (body(reasoning=True, reasoning_effort="none"), InvalidRequest, "contradicts"),
    ],
)
def test_bad_requests_say_what_is_wrong(
    raw: bytes, error: type[RequestError], fragment: str
) -> None:
    with pytest.raises(error) as info:
        parse_chat_request(raw)
    assert fragment in info.value.message
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("fields", "required"),
    [
        ({}, set()),
        ({"tools": None}, set()),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, {Capability.TOOLS}),
        ({"response_format": {"type": "json_object"}}, set()),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "answer"}}},
            {Capability.JSON_SCHEMA},
        ),
        ({"reasoning": True}, {Capability.REASONING}),
        ({"reasoning_effort": "high"}, {Capability.REASONING}),
        ({"reasoning_effort": "none"}, set()),
        ({"reasoning": False}, set()),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this"},
                            {"type": "image_url", "image_url": {"url": "data:..."}},
                        ],
                    }
                ]
            },
            {Capability.VISION},
        ),
    ],
)
def test_required_capabilities_come_from_the_request(
    fields: dict[str, Any], required: set[Capability]
) -> None:
    assert parse_chat_request(body(**fields)).required == required


@pytest.mark.parametrize(
    ("fields", "reasoning"),
    [
        ({}, None),
        ({"reasoning": True}, True),
        ({"reasoning": False}, False),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "low"}, True),
        ({"reasoning": False, "reasoning_effort": "none"}, False),
    ],
)
def test_reasoning_switch(fields: dict[str, Any], reasoning: bool | None) -> None:
    assert parse_chat_request(body(**fields)).reasoning is reasoning


def test_usage_is_only_included_on_streams_that_ask() -> None:
    assert parse_chat_request(body(stream=True)).include_usage is False
    assert parse_chat_request(
        body(stream=True, stream_options={"include_usage": True})
    ).include_usage
    assert not parse_chat_request(body(stream=True, stream_options=None)).include_usage
    # OpenAI refuses stream_options on a request that does not stream.
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request(body(stream_options={"include_usage": True}))
    assert info.value.param == "stream_options"


@pytest.mark.parametrize(
    ("raw", "message", "param"),
    [
        (b"[]", "request body must be a JSON object", None),
        (b'{"messages": []}', "'model' must be a non-empty string (an alias)", "model"),
        (body(reasoning="on"), "'reasoning' must be true or false", "reasoning"),
        (
            body(reasoning_effort="max"),
            "'reasoning_effort' must be one of none, minimal, low, medium, high, xhigh; got 'max'",
            "reasoning_effort",
        ),
        (
            body(reasoning=True, reasoning_effort="none"),
            "'reasoning': true contradicts 'reasoning_effort': 'none'",
            "reasoning",
        ),
        (body(n=2), "only n=1 is supported", "n"),
        (body(top_logprobs=2), "logprobs are not supported by the gateway", "logprobs"),
    ],
)
def test_the_exact_words_and_param_of_a_refusal(
    raw: bytes, message: str, param: str | None
) -> None:
    """What a client's SDK shows: the message and the offending field, word for word."""
    with pytest.raises(RequestError) as info:
        parse_chat_request(raw)
    assert (info.value.message, info.value.param) == (message, param)


def test_a_lone_surrogate_is_refused_raw_or_escaped() -> None:
    # No upstream can be sent one (UTF-8 has no encoding for it); OpenAI refuses it as invalid
    # JSON too. Raw (bytes that encode U+D800) it is not UTF-8; escaped, not JSON (test_body.py).
    raw = b'{"model": "a", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'
    escaped = b'{"model": "a", "messages": [{"role": "user", "content": "\\ud800"}]}'
    for body in (raw, escaped):
        with pytest.raises(InvalidJSON):
            parse_chat_request(body)
