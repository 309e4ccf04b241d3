"""The OpenAI front's encoders: gateway events → ``chat.completion.chunk`` SSE, or one
``chat.completion`` object. Pure; the model name is always the alias the client used.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Any

from trio_gateway.core.errors import GatewayError
from trio_gateway.core.events import (
    ErrorEvent,
    Event,
    ReasoningDelta,
    ReasoningDetail,
    ResponseCancelled,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.reasoning_details import detail_object
from trio_gateway.core.sse import DONE, encode_event

# json.dumps with arguments builds a new encoder per call; this one is built once (it keeps no
# state between calls).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _dumps(obj: Any) -> bytes:
    return _ENCODER.encode(obj).encode()


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def error_chunk(error: GatewayError) -> bytes:
    """An error after the stream began: the shape the OpenAI SDK raises ``APIError`` for."""
    return encode_event(_dumps(error.to_body()))


class ChunkEncoder:
    """Events → SSE bytes for one streamed response."""

    def __init__(
        self, *, completion_id: str, created: int, model: str, include_usage: bool
    ) -> None:
        self._include_usage = include_usage
        # Every content chunk shares its head and tail: build them once, not per token.
        head = {"id": completion_id, "object": "chat.completion.chunk", "created": created}
        head["model"] = model
        self._head = _dumps(head)[:-1] + b',"choices":[{"index":0,"delta":'
        self._tail = b',"logprobs":null,"finish_reason":null}]'
        self._tail += b',"usage":null}' if include_usage else b"}"
        self._meta = head
        self._usage: Usage | None = None
        # The two chunks of almost every token, as whole SSE events around one JSON string:
        # the string is escaped by the same function json.dumps uses, so the bytes are the same.
        self._content = b"data: " + self._head + b'{"content":'
        self._reasoning = b"data: " + self._head + b'{"reasoning_content":'
        self._text_end = b"}" + self._tail + b"\n\n"

    def _chunk(self, delta: dict[str, Any]) -> bytes:
        return encode_event(self._head + _dumps(delta) + self._tail)

    def encode(self, event: Event) -> bytes:
        if type(event) is TextDelta:
            return self._content + encode_basestring(event.text).encode() + self._text_end
        if type(event) is ReasoningDelta:
            return self._reasoning + encode_basestring(event.text).encode() + self._text_end
        if isinstance(event, ReasoningDetail):
            # Whole, once: a client appends each to the message it sends back.
            return self._chunk({"reasoning_details": [detail_object(event)]})
        if isinstance(event, ToolCallDelta):
            fragment: dict[str, Any] = {"index": event.index}
            function: dict[str, Any] = {}
            if event.id is not None:
                fragment["id"] = event.id
                fragment["type"] = "function"
            if event.name is not None:
                function["name"] = event.name
            function["arguments"] = event.arguments
            fragment["function"] = function
            return self._chunk({"tool_calls": [fragment]})
        if isinstance(event, ResponseStarted):
            return self._chunk({"role": "assistant", "content": ""})
        if isinstance(event, Usage):
            # Held back: OpenAI sends usage after the finish chunk, and only when asked.
            self._usage = event
            return b""
        if isinstance(event, ResponseDone):
            out = self.finish_chunk(event.finish_reason)
            if self._include_usage and self._usage is not None:
                usage_chunk = dict(self._meta)
                usage_chunk["choices"] = []
                usage_chunk["usage"] = usage_object(self._usage)
                out += encode_event(_dumps(usage_chunk))
            return out + DONE
        if isinstance(event, ErrorEvent):
            body = {"error": {"message": event.message, "type": "server_error", "code": event.code}}
            return encode_event(_dumps(body))
        if isinstance(event, ToolCallDone | ResponseCancelled):
            return b""
        raise TypeError(f"unknown event {event!r}")

    def finish_chunk(self, finish_reason: str) -> bytes:
        """The chunk that ends the choice (without the usage chunk and ``[DONE]``)."""
        finish = dict(self._meta)
        choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}
        finish["choices"] = [choice]
        if self._include_usage:
            finish["usage"] = None
        return encode_event(_dumps(finish))


class ResponseAccumulator:
    """Events → one ``chat.completion`` object, for clients that did not ask to stream."""

    def __init__(self, *, completion_id: str, created: int, model: str) -> None:
        self._meta = {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
        }
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._details: list[ReasoningDetail] = []
        self._tool_calls: list[ToolCallDone] = []
        self._usage: Usage | None = None
        self.finish_reason: str | None = None

    def add(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self._text.append(event.text)
        elif isinstance(event, ReasoningDelta):
            self._reasoning.append(event.text)
        elif isinstance(event, ReasoningDetail):
            self._details.append(event)
        elif isinstance(event, ToolCallDone):
            self._tool_calls.append(event)
        elif isinstance(event, Usage):
            self._usage = event
        elif isinstance(event, ResponseDone):
            self.finish_reason = event.finish_reason

    def result(self) -> dict[str, Any]:
        content = "".join(self._text)
        if self._tool_calls and not content.strip():
            # Qwen3 writes "\n\n" between </think> and a tool call; vLLM's own non-streamed
            # answer says null there, and so does OpenAI.
            content = ""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content or None,
            "refusal": None,
        }
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        if self._details:
            message["reasoning_details"] = [detail_object(d) for d in self._details]
        if self._tool_calls:
            message["tool_calls"] = [_tool_call(call) for call in self._tool_calls]
        body = dict(self._meta)
        body["choices"] = [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}
        ]
        if self._usage is not None:
            body["usage"] = usage_object(self._usage)
        return body


def _tool_call(call: ToolCallDone) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        # OpenAI's shape: arguments stay a JSON string, exactly as the model wrote them.
        "function": {"name": call.name, "arguments": call.arguments_raw},
    }
    if not call.arguments_valid:
        out["arguments_valid"] = False
    return out


def dumps(obj: Any) -> bytes:
    return _dumps(obj)
