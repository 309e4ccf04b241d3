from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.sim import SimConfig
from trio_gateway.sim.errors import ApiError
from trio_gateway.sim.request import ChatRequest, parse_chat_request

from .helpers import fixture_json, misc_errors

CONFIG = SimConfig(max_model_len=2048)
PARIS = [{"role": "user", "content": "hello, what is the weather in paris"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def parse(body: dict[str, Any] | bytes, config: SimConfig = CONFIG) -> ChatRequest | ApiError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_chat_request(raw, config)


def refused(body: dict[str, Any] | bytes, config: SimConfig = CONFIG) -> ApiError:
    result = parse(body, config)
    assert isinstance(result, ApiError), result
    return result


def accepted(body: dict[str, Any], config: SimConfig = CONFIG) -> ChatRequest:
    result = parse(body, config)
    assert isinstance(result, ChatRequest), result
    return result


def test_unknown_model_is_vllms_404() -> None:
    status, text = misc_errors()["unknown model"]
    error = refused({"model": "other-model", "messages": PARIS})
    assert (error.status, json.dumps(error.body, separators=(",", ":"))) == (status, text)


def test_max_tokens_over_max_model_len_is_vllms_400() -> None:
    status, text = misc_errors()["max_tokens 3000 > max_model_len"]
    for field in ("max_tokens", "max_completion_tokens"):
        error = refused({"model": "qwen3-32b", "messages": PARIS, field: 3000})
        assert (error.status, json.dumps(error.body, separators=(",", ":"))) == (status, text)


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_over_max_model_len_is_vllms_400(stream: bool) -> None:
    # The fixture's request: 'hello world weather' x1200; vLLM reports max_model_len + 1.
    content = "hello world weather" * 1200
    error = refused({"messages": [{"role": "user", "content": content}], "stream": stream})
    assert error.status == 400
    assert error.body == fixture_json(f"d_too_long_stream_{stream}.json")


def test_auto_tool_choice_needs_the_parser() -> None:
    no_parser = SimConfig(tool_call_parser=False)
    for extra in ({"tool_choice": "auto"}, {}):  # tools alone default to "auto"
        error = refused({"messages": PARIS, "tools": TOOLS, **extra}, no_parser)
        assert error.status == 400
        assert error.body["error"]["message"] == (
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    assert not accepted(
        {"messages": PARIS, "tools": TOOLS, "tool_choice": "none"}, no_parser
    ).parse_tools
    assert accepted(
        {"messages": PARIS, "tools": TOOLS, "tool_choice": "required"}, no_parser
    ).parse_tools


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "json_invalid"),
        (b"[1, 2]", "model_attributes_type"),
        (b'{"model": "qwen3-32b"}', "'loc': ('body', 'messages'), 'msg': 'Field required'"),
        (b'{"messages": "hi"}', "list_type"),
        (b'{"messages": [{"content": "x"}]}', "'loc': ('body', 'messages', 0, 'role')"),
        (b'{"messages": [], "max_tokens": "8"}', "int_type"),
        (b'{"messages": [], "stream": "yes"}', "bool_parsing"),
        (b'{"messages": [], "max_tokens": 0}', "max_tokens must be at least 1, got 0."),
        (
            b'{"messages": [], "stream_options": {"include_usage": true}}',
            "Stream options can only be defined when `stream=True`.",
        ),
    ],
)
def test_malformed_requests_get_a_bad_request_error(body: bytes, fragment: str) -> None:
    error = refused(body)
    assert error.status == 400
    assert error.body["error"]["type"] == "BadRequestError"
    assert error.body["error"]["code"] == 400
    assert fragment in error.body["error"]["message"]


def test_ignored_fields_are_accepted() -> None:
    accepted({"messages": PARIS, "user": "u-1", "store": True, "metadata": {"k": "v"}})


def test_max_tokens_is_clamped_to_the_room_left() -> None:
    # d_prompt_plus_max_tokens.json: prompt + max_tokens over the limit is not refused.
    prompt = accepted({"messages": PARIS}).prompt.tokens
    assert accepted({"messages": PARIS}).max_tokens == 2048 - prompt
    assert accepted({"messages": PARIS, "max_tokens": 2040}).max_tokens == 2048 - prompt
    assert accepted({"messages": PARIS, "max_tokens": 20}).max_tokens == 20
    both = {"messages": PARIS, "max_tokens": 20, "max_completion_tokens": 7}
    assert accepted(both).max_tokens == 7


def test_flags_read_from_the_request() -> None:
    plain = accepted({"model": "qwen3-32b", "messages": PARIS})
    assert (plain.stream, plain.include_usage, plain.thinking, plain.parse_tools) == (
        False,
        False,
        True,
        False,
    )
    off = {"messages": PARIS, "chat_template_kwargs": {"enable_thinking": False}}
    assert accepted(off).thinking is False
    usage = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    streamed = accepted({"messages": PARIS, "stream": True, **usage})
    assert (streamed.stream, streamed.include_usage, streamed.continuous_usage) == (True,) * 3
    only_continuous = {"stream_options": {"continuous_usage_stats": True}}
    assert not accepted({"messages": PARIS, "stream": True, **only_continuous}).continuous_usage
    tools = accepted({"messages": PARIS, "tools": TOOLS, "parallel_tool_calls": False})
    assert (tools.parse_tools, tools.parallel_tool_calls) == (True, False)
