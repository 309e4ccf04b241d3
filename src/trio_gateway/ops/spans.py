"""The gateway's own spans, as the request path sees them, and what they say. Pure: no
OpenTelemetry here (``ops/otel.py`` implements these with its SDK, and is imported only when
``[tracing]`` is configured).

::

    server span    one per request: POST /v1/chat/completions, ..., each request on /v1/ws
    │              GenAI attributes (gen_ai.*) and the gateway's own (trio_gateway.*); events
    │              queued, admitted, spill, failover, first_token
    └── attempt    one per upstream attempt (client span): provider, server.address, HTTP
                   status, time to headers, error; its id is the parent id of the
                   ``traceparent`` sent upstream, so vLLM's own span is its child

The request path holds a :class:`RequestSpan` (``RequestContext.span``) only when tracing is on
and the request's trace is sampled: off, every hook is one ``is None`` test, and nothing is made
per request. The names follow the OpenTelemetry GenAI semantic conventions (Development status;
docs/operations.md has the table).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from trio_gateway.core.events import CompletionText, Event, ResponseDone, TextDelta, ToolCallDone
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.usage import UsageRecord
from trio_gateway.ops.tracing import TraceContext

Attribute = str | bool | int | float | tuple[str, ...]
Attributes = Mapping[str, Attribute]
Emit = Callable[[list[Event]], Awaitable[None]]

# gen_ai.operation.name, by the endpoint a request came to (the agent fronts are chat).
OPERATIONS = {
    RequestKind.CHAT: "chat",
    RequestKind.COMPLETIONS: "text_completion",
    RequestKind.EMBEDDINGS: "embeddings",
}
# gen_ai.provider.name, by provider type: the conventions' well-known values, and "vllm" (a
# value of the gateway's own, as the conventions allow) for openai_compatible, which is vLLM's
# dialect.
PROVIDER_NAMES = {
    "openai_compatible": "vllm",
    "openai": "openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "vertex": "gcp.vertex_ai",
}
# Captured content (capture_content = true) is recorded whole or not at all: a prompt or an
# answer whose JSON is longer is left out, and the span says so. 64 Ki characters keeps a span
# well under a collector's usual 4 MiB request limit, with a batch of them.
MAX_CONTENT_CHARS = 64 * 1024


class AttemptSpan(Protocol):
    """One upstream attempt's client span."""

    @property
    def trace(self) -> TraceContext:
        """The context to send upstream: this span's id as the parent id."""
        ...

    def headers(self, status: int) -> None:
        """The response's head came, with ``status``: the time to headers."""

    def end(self, error: BaseException | None) -> None:
        """The attempt is over: answered (``None``), failed, or cancelled."""


class RequestSpan(Protocol):
    """One request's server span (recording: a sampled trace)."""

    @property
    def trace(self) -> TraceContext:
        """This span's context: its id is the parent of every attempt's."""
        ...

    def request(self, request: ChatRequest, response_id: str) -> None:
        """The validated request, once it reaches the relay (before its body is released)."""

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        """Something that happened now (queued, admitted, spill, failover)."""

    def attempt(self, provider: str, provider_type: str, model: str, endpoint: str) -> AttemptSpan:
        """A child span for one upstream attempt, started now."""
        ...

    def observe(self, emit: Emit) -> Emit:
        """``emit``, seeing each batch of events on its way to the client (finish reasons,
        captured content)."""
        ...

    def record(self, record: UsageRecord) -> None:
        """The request's usage record: its outcome, code, tokens and first token."""

    def end(self, status: int | None, alias: str | None) -> None:
        """The request is over (``status`` sent, None on a WebSocket); the span is exported."""


class Tracing(Protocol):
    """Where server spans come from (``ops/otel.OtelTracing``)."""

    def start(
        self, route: str, traceparent: str | None, tracestate: str | None
    ) -> tuple[RequestSpan | None, TraceContext]:
        """A request's span, a child of the client's ``traceparent`` when it has one, and its
        context. The span is None when the trace is not sampled: the context still carries
        the ids (and the unsampled flag) upstream."""
        ...

    async def aclose(self) -> None:
        """Export what is queued (bounded), then stop the exporter's thread."""


def _number(value: object) -> float | None:
    """A JSON number as a float; None for anything else (``true`` is no number here)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def request_attributes(request: ChatRequest, response_id: str) -> dict[str, Attribute]:
    """A validated request's attributes: what was asked, of which alias, by which key."""
    body = request.body
    out: dict[str, Attribute] = {
        "gen_ai.operation.name": OPERATIONS[request.kind],
        "gen_ai.request.model": request.alias,
        "gen_ai.response.id": response_id,
        "trio_gateway.endpoint": request.front or request.kind.value,
        "trio_gateway.priority": request.priority,
    }
    if request.stream:
        out["gen_ai.request.stream"] = True
    if request.key_name is not None:
        out["trio_gateway.key"] = request.key_name
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        out["gen_ai.request.max_tokens"] = max_tokens
    for field in ("temperature", "top_p"):
        value = _number(body.get(field))
        if value is not None:
            out[f"gen_ai.request.{field}"] = value
    return out


def record_attributes(record: UsageRecord) -> dict[str, Attribute]:
    """A usage record's attributes: how the request ended, and its tokens."""
    out: dict[str, Attribute] = {
        "trio_gateway.outcome": record.outcome,
        "trio_gateway.cancelled": record.outcome == "cancelled",
    }
    if record.alias is not None:
        out["gen_ai.request.model"] = record.alias
    if record.error_code is not None:
        out["trio_gateway.code"] = record.error_code
        if record.outcome != "cancelled":
            out["error.type"] = record.error_code
    if record.provider is not None:
        out["trio_gateway.provider"] = record.provider
    if record.key is not None:
        out["trio_gateway.key"] = record.key
    if record.priority is not None:
        out["trio_gateway.priority"] = record.priority
    if record.filtered:
        out["trio_gateway.filtered"] = tuple(record.filtered.split(","))
    if record.dropped_tools:
        out["trio_gateway.dropped_tools"] = tuple(record.dropped_tools.split(","))
    if record.ttft_s is not None:
        out["gen_ai.response.time_to_first_chunk"] = record.ttft_s
    if record.outcome != "refused":
        out["gen_ai.usage.input_tokens"] = record.prompt_tokens
        out["gen_ai.usage.output_tokens"] = record.completion_tokens
        if record.cached_tokens:
            out["gen_ai.usage.cache_read.input_tokens"] = record.cached_tokens
        if record.reasoning_tokens:
            out["gen_ai.usage.reasoning.output_tokens"] = record.reasoning_tokens
        out["trio_gateway.usage.estimated"] = record.estimated
    return out


def provider_name(provider_type: str) -> str:
    """gen_ai.provider.name for a provider type."""
    return PROVIDER_NAMES.get(provider_type, provider_type)


def _parts(content: object) -> list[dict[str, Any]]:
    """A message's content as the conventions' parts: text as it is, media by their type only
    (an image's base64 is not content anyone reads in a trace)."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "content": part["text"]})
            else:
                parts.append({"type": str(kind)})
    return parts


def _message(message: object) -> dict[str, Any]:
    if not isinstance(message, dict):
        return {"role": "user", "parts": []}
    role = str(message.get("role"))
    if role == "tool":
        parts: list[dict[str, Any]] = [
            {
                "type": "tool_call_response",
                "id": message.get("tool_call_id"),
                "response": message.get("content"),
            }
        ]
    else:
        parts = _parts(message.get("content"))
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments"),
                }
            )
    return {"role": role, "parts": parts}


def input_messages(request: ChatRequest) -> str | None:
    """gen_ai.input.messages (JSON, in the conventions' schema): a chat's messages, or a
    completion's prompt and an embedding's input as one user message. None past
    :data:`MAX_CONTENT_CHARS`."""
    body = request.body
    if request.kind is RequestKind.CHAT:
        messages = [_message(m) for m in body.get("messages") or ()]
    else:
        given = body.get("prompt" if request.kind is RequestKind.COMPLETIONS else "input")
        texts = given if isinstance(given, list) else [given]
        parts = [{"type": "text", "content": t} for t in texts if isinstance(t, str)]
        messages = [{"role": "user", "parts": parts}]
    text = json.dumps(messages, ensure_ascii=False)
    return text if len(text) <= MAX_CONTENT_CHARS else None


class AnswerWatch:
    """What a span notes of an answer's events on their way to the client: the finish reasons
    and, with ``capture``, the text and tool calls (bounded by :data:`MAX_CONTENT_CHARS`; past
    it, nothing more is kept and the output is left out)."""

    __slots__ = ("_calls", "_capture", "_chars", "_texts", "finish_reasons", "overflowed")

    def __init__(self, *, capture: bool) -> None:
        self.finish_reasons: list[str] = []
        self.overflowed = False
        self._capture = capture
        self._texts: dict[int, list[str]] = {}
        self._calls: list[dict[str, Any]] = []
        self._chars = 0

    def feed(self, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, ResponseDone):
                self.finish_reasons.append(event.finish_reason)
            elif isinstance(event, CompletionText):
                if event.finish_reason is not None:
                    self.finish_reasons.append(event.finish_reason)
                if self._capture:
                    self._keep(event.index, event.text)
            elif self._capture:
                if isinstance(event, TextDelta):
                    self._keep(0, event.text)
                elif isinstance(event, ToolCallDone):
                    self._chars += len(event.arguments_raw) + len(event.name)
                    self._calls.append(
                        {
                            "type": "tool_call",
                            "id": event.id,
                            "name": event.name,
                            "arguments": event.arguments,
                        }
                    )

    def _keep(self, index: int, text: str) -> None:
        self._chars += len(text)
        if self._chars > MAX_CONTENT_CHARS:
            self.overflowed = True
            return
        self._texts.setdefault(index, []).append(text)

    def output_messages(self) -> str | None:
        """gen_ai.output.messages (JSON): one assistant message per choice. None when nothing
        was captured, or past the bound."""
        if not self._capture or self.overflowed or self._chars > MAX_CONTENT_CHARS:
            return None
        messages: list[dict[str, Any]] = []
        indexes = sorted(set(self._texts) | ({0} if self._calls else set()))
        for position, index in enumerate(indexes):
            calls = self._calls if index == 0 else []
            text = "".join(self._texts.get(index, ()))
            # An answer of tool calls alone has no text part.
            parts = [{"type": "text", "content": text}] if text or not calls else []
            parts += calls
            message: dict[str, Any] = {"role": "assistant", "parts": parts}
            if position < len(self.finish_reasons):
                message["finish_reason"] = self.finish_reasons[position]
            messages.append(message)
        if not messages:
            return None
        text = json.dumps(messages, ensure_ascii=False, default=str)
        return text if len(text) <= MAX_CONTENT_CHARS else None
