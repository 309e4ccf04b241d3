"""Pure request validation: bytes of a chat-completion request in, a `ChatRequest` or the exact
`ApiError` vLLM would answer out.

The checks run in vLLM's order: body shape, model, tool choice, `max_tokens`, prompt length.
Only fields that change what the simulator does are read; everything else (`temperature`,
`store`, `metadata`, `user`, ...) is accepted and ignored, as vLLM does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from . import errors
from .config import SimConfig
from .errors import ApiError
from .text import PromptInfo, count_prompt

__all__ = ["ChatRequest", "chat_request_from", "decode_body", "parse_chat_request"]


@attrs.frozen(kw_only=True)
class ChatRequest:
    messages: tuple[Mapping[str, Any], ...]
    stream: bool
    include_usage: bool
    continuous_usage: bool
    # The effective output budget: the request's max_tokens clamped to what the context leaves.
    max_tokens: int
    ignore_eos: bool
    thinking: bool
    # True when tool calls in the output are parsed into `tool_calls` (hermes parser at work).
    parse_tools: bool
    parallel_tool_calls: bool
    prompt: PromptInfo
    # Qwen3 writes "\n\n" after its thinking; the cloud models' text starts right away.
    blank_after_think: bool = True
    # vLLM's `priority`, lower first; accepted under either scheduling policy (vLLM 0.32
    # ignores it under "fcfs" rather than refusing it), read under "priority".
    priority: int = 0


def _decode(body: bytes) -> dict[str, Any] | ApiError:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return errors.validation_error("json_invalid", (0,), "JSON decode error")
    if not isinstance(data, dict):
        return errors.validation_error(
            "model_attributes_type",
            (),
            "Input should be a valid dictionary or object to extract fields from",
        )
    return data


def _check_types(data: Mapping[str, Any]) -> ApiError | None:
    messages = data.get("messages")
    if messages is None:
        return errors.validation_error("missing", ("messages",), "Field required")
    if not isinstance(messages, list):
        return errors.validation_error("list_type", ("messages",), "Input should be a valid list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return errors.validation_error("missing", ("messages", i, "role"), "Field required")
    for name in ("stream", "ignore_eos", "parallel_tool_calls"):
        if name in data and data[name] is not None and not isinstance(data[name], bool):
            return errors.validation_error(
                "bool_parsing", (name,), "Input should be a valid boolean"
            )
    for name in ("max_tokens", "max_completion_tokens", "priority"):
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return errors.validation_error("int_type", (name,), "Input should be a valid integer")
    for name in ("stream_options", "chat_template_kwargs"):
        if data.get(name) is not None and not isinstance(data[name], dict):
            return errors.validation_error(
                "model_type", (name,), "Input should be a valid dictionary"
            )
    if data.get("stream_options") is not None and not data.get("stream"):
        return errors.validation_error(
            "value_error",
            (),
            "Value error, Stream options can only be defined when `stream=True`.",
        )
    return None


def _tool_choice(data: Mapping[str, Any]) -> Any:
    choice = data.get("tool_choice")
    # vLLM defaults tool_choice to "auto" as soon as tools are given, "none" otherwise.
    if choice is None:
        return "auto" if data.get("tools") else "none"
    return choice


def decode_body(body: bytes) -> dict[str, Any] | ApiError:
    """The JSON object of a request body, or vLLM's 400 for anything else."""
    return _decode(body)


def parse_chat_request(body: bytes, config: SimConfig) -> ChatRequest | ApiError:
    data = _decode(body)
    if isinstance(data, ApiError):
        return data
    return chat_request_from(data, config)


def chat_request_from(
    data: Mapping[str, Any], config: SimConfig, *, blank_after_think: bool = True
) -> ChatRequest | ApiError:
    """Validate a decoded chat-completion body (see `parse_chat_request`)."""
    problem = _check_types(data)
    if problem is not None:
        return problem

    model = data.get("model")
    if model is not None and model != config.served_model_name:
        return errors.model_not_found(str(model), config.served_model_name)

    tool_choice = _tool_choice(data)
    if tool_choice == "auto" and not config.tool_call_parser:
        return errors.auto_tool_choice_unsupported()
    tools = data.get("tools") or None
    # "required" and a named function are served by guided decoding in vLLM, parser or not.
    parse_tools = (
        bool(tools) and tool_choice != "none" and (config.tool_call_parser or tool_choice != "auto")
    )

    requested = data.get("max_completion_tokens")
    if requested is None:
        requested = data.get("max_tokens")
    if requested is not None:
        if requested > config.max_model_len:
            return errors.max_tokens_too_large(requested, config.max_model_len)
        if requested < 1:
            return errors.max_tokens_too_small(requested)

    template_kwargs = data.get("chat_template_kwargs") or {}
    thinking = template_kwargs.get("enable_thinking", True) is not False
    messages = tuple(data["messages"])
    prompt = count_prompt(messages, tools, thinking=thinking)
    if prompt.tokens >= config.max_model_len:
        return errors.context_too_long(config.max_model_len, prompt.tokens)

    # vLLM clamps prompt + max_tokens to the context instead of refusing (finish "length").
    room = config.max_model_len - prompt.tokens
    stream_options = data.get("stream_options") or {}
    include_usage = bool(stream_options.get("include_usage"))
    return ChatRequest(
        messages=messages,
        stream=bool(data.get("stream")),
        include_usage=include_usage,
        continuous_usage=include_usage and bool(stream_options.get("continuous_usage_stats")),
        max_tokens=room if requested is None else min(requested, room),
        ignore_eos=bool(data.get("ignore_eos")),
        thinking=thinking,
        parse_tools=parse_tools,
        parallel_tool_calls=data.get("parallel_tool_calls") is not False,
        prompt=prompt,
        blank_after_think=blank_after_think,
        priority=data.get("priority") or 0,
    )
