"""Pure parts of the `anthropic` dialect: Anthropic's Messages API (`POST /v1/messages`).

A request is checked the way the API checks it (strict body, alternating roles, thinking rules)
and turned into the engine's `ChatRequest`: the messages are normalised to chat-completion
shape so the script, the prompt counting and the seed work exactly as in every dialect (a user
message made only of `tool_result` blocks plays the part of OpenAI's `tool` message).
The answer is rendered as the Messages stream grammar or a whole Message object.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from .anthropic_request import (
    ERROR_TYPES,
    MessagesRequest,
    anthropic_error,
    parse_messages_request,
    thinking_signature,
)
from .errors import ApiError, retry_after_header
from .script import Fault, Generation
from .wire import dumps

__all__ = [
    "AnthropicContext",
    "AnthropicStream",
    "MessagesRequest",
    "anthropic_error",
    "anthropic_fault",
    "message_body",
    "parse_messages_request",
]

DEFAULT_RETRY_AFTER_S = 1  # what a 429/529 says when the script gives no retry_after

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _stop_reason(generation: Generation) -> str:
    return generation.vendor_finish or _STOP_REASONS[generation.finish_reason]


def _fault_type(fault: Fault) -> tuple[str, str]:
    type_, message = ERROR_TYPES.get(
        fault.status, ("api_error" if fault.status >= 500 else "invalid_request_error", "")
    )
    return fault.error or type_, message or f"simulated HTTP {fault.status}"


def anthropic_fault(fault: Fault) -> ApiError:
    type_, message = _fault_type(fault)
    retry = fault.retry_after
    if retry is None and fault.status in (429, 529):
        retry = DEFAULT_RETRY_AFTER_S
    headers = retry_after_header(retry)
    if fault.body is not None:
        return ApiError(status=fault.status, body=fault.body, headers=headers)
    return anthropic_error(fault.status, type_, message, headers)


# ---- the answer ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AnthropicContext:
    message_id: str  # "msg_..."
    model: str
    prompt_tokens: int
    tool_ids: tuple[str, ...]  # "toolu_...", one per tool call
    thinking: bool


def _usage(ctx: AnthropicContext, cached: int, output: int, reasoning: int) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "input_tokens": ctx.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output,
    }
    if ctx.thinking:
        usage["output_tokens_details"] = {"thinking_tokens": reasoning}
    return usage


def _event(name: str, value: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + dumps(value) + b"\n\n"


class AnthropicStream:
    """The Messages stream grammar, one generated token at a time (feed 0, 1, ... in order):
    `message_start`, `ping`, per block `content_block_start` / `_delta`* / `_stop`,
    `message_delta`, `message_stop`."""

    def __init__(self, ctx: AnthropicContext, generation: Generation) -> None:
        self._ctx = ctx
        self._generation = generation
        self._block = -1  # index of the open content block
        self._open: str | None = None  # its type
        self._thinking: list[str] = []  # the open thinking block's text, for its signature
        self._reasoning = 0
        self._cached = 0

    def _start(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        events = self._close()
        self._block += 1
        self._open = kind
        start = {"type": "content_block_start", "index": self._block, "content_block": block}
        return [*events, _event("content_block_start", start)]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        events: list[bytes] = []
        if self._open == "thinking":
            delta = {
                "type": "signature_delta",
                "signature": thinking_signature("".join(self._thinking)),
            }
            events.append(self._delta(delta))
            self._thinking.clear()
        self._open = None
        stop = {"type": "content_block_stop", "index": self._block}
        return [*events, _event("content_block_stop", stop)]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        value = {"type": "content_block_delta", "index": self._block, "delta": delta}
        return _event("content_block_delta", value)

    def token(self, index: int, cached_tokens: int = 0) -> list[bytes]:
        ctx = self._ctx
        events: list[bytes] = []
        if index == 0:
            self._cached = cached_tokens
            message: dict[str, Any] = {
                "id": ctx.message_id,
                "type": "message",
                "role": "assistant",
                "model": ctx.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": _usage(ctx, cached_tokens, 1, 0),
            }
            events.append(_event("message_start", {"type": "message_start", "message": message}))
            events.append(_event("ping", {"type": "ping"}))
        token = self._generation.tokens[index]
        if token.kind == "reasoning":
            self._reasoning += 1
            if self._open != "thinking":
                events += self._start("thinking", {"type": "thinking", "thinking": ""})
            self._thinking.append(token.text)
            events.append(self._delta({"type": "thinking_delta", "thinking": token.text}))
        elif token.kind == "content" and token.text:
            if self._open != "text":
                events += self._start("text", {"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": token.text}))
        elif token.kind == "tool_name":
            block = {
                "type": "tool_use",
                "id": ctx.tool_ids[token.tool_index],
                "name": token.text,
                "input": {},
            }
            events += self._start("tool_use", block)
            events.append(self._delta({"type": "input_json_delta", "partial_json": ""}))
        elif token.kind == "tool_args" and self._open == "tool_use":
            events.append(self._delta({"type": "input_json_delta", "partial_json": token.text}))
        if index == len(self._generation.tokens) - 1:
            events += self._close()
            stop_reason = _stop_reason(self._generation)
            delta = {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": _usage(ctx, self._cached, index + 1, self._reasoning),
            }
            events.append(_event("message_delta", delta))
            events.append(_event("message_stop", {"type": "message_stop"}))
        return events

    def stream_error(self, fault: Fault) -> list[bytes]:
        # After a 200 the status cannot change: the error is one more event, and the body
        # ends without `message_stop`.
        body = fault.body
        if body is None:
            type_, message = _fault_type(fault)
            body = {"type": "error", "error": {"type": type_, "message": message}}
        return [_event("error", body)]


def _tool_input(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}  # a scripted invalid-JSON argument string has no Message-object form
    return value if isinstance(value, dict) else {}


def message_body(
    ctx: AnthropicContext, generation: Generation, produced: int, cached_tokens: int
) -> dict[str, Any]:
    """The whole Message after `produced` tokens."""
    content: list[dict[str, Any]] = []
    arguments: dict[int, list[str]] = {}
    reasoning = 0
    for token in generation.tokens[:produced]:
        last = content[-1] if content else None
        if token.kind == "reasoning":
            reasoning += 1
            if last is None or last["type"] != "thinking":
                last = {"type": "thinking", "thinking": "", "signature": ""}
                content.append(last)
            last["thinking"] += token.text
        elif token.kind == "content" and token.text:
            if last is None or last["type"] != "text":
                last = {"type": "text", "text": ""}
                content.append(last)
            last["text"] += token.text
        elif token.kind == "tool_name":
            arguments[token.tool_index] = []
            content.append(
                {
                    "type": "tool_use",
                    "id": ctx.tool_ids[token.tool_index],
                    "name": token.text,
                    "input": token.tool_index,  # replaced below, once all pieces are in
                }
            )
        elif token.kind == "tool_args" and token.tool_index in arguments:
            arguments[token.tool_index].append(token.text)
    for block in content:
        if block["type"] == "thinking":
            block["signature"] = thinking_signature(block["thinking"])
        elif block["type"] == "tool_use":
            block["input"] = _tool_input("".join(arguments[block["input"]]))
    return {
        "id": ctx.message_id,
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": _stop_reason(generation),
        "stop_sequence": None,
        "usage": _usage(ctx, cached_tokens, produced, reasoning),
    }
