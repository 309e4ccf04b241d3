"""The ``openai_compatible`` provider type (vLLM, and servers that speak its dialect).

Pure parts: :func:`build_body` (client request → upstream body), :class:`ChunkParser`
(upstream chunk objects → gateway events), :func:`parse_completion` (a whole answer) and
:class:`OpenAICompatibleDialect`, the table entry. The I/O lives in ``providers/upstream.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.endpoints import COMPLETIONS_DEFAULT_MAX_TOKENS, completion_choices
from trio_gateway.core.errors import GatewayError, UpstreamProtocolError
from trio_gateway.core.events import (
    Event,
    ReasoningDelta,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
)
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.request import GATEWAY_FIELDS, ChatRequest
from trio_gateway.core.sse import json_data
from trio_gateway.core.toolcalls import ToolCallAssembler
from trio_gateway.providers.dialect import UpstreamCall
from trio_gateway.providers.errors import classify_inband, classify_status
from trio_gateway.providers.openai_compatible.endpoints import MAX_EMBEDDINGS_BYTES, KindReader
from trio_gateway.providers.openai_compatible.stream_state import OpenAIStream
from trio_gateway.providers.openai_compatible.usage import parse_usage
from trio_gateway.providers.output_caps import held_output_tokens, known_output_cap
from trio_gateway.providers.translate import without_reasoning_details

# Fields vLLM accepts and silently ignores: stripped, so "ignored" never looks like "applied".
IGNORED_FIELDS = frozenset({"store", "metadata", "user"})
# More parallel tool calls than any model makes: a bound on what one answer may hold.
MAX_TOOL_CALLS = 128
# Fields the gateway translates itself.
TRANSLATED_FIELDS = frozenset({"reasoning_effort", "stream_options", "stream"}) | GATEWAY_FIELDS
# Never sent as the client gave them, whatever the provider (its strip_fields come on top).
DROPPED_FIELDS = IGNORED_FIELDS | TRANSLATED_FIELDS
CALL_HEADERS: Mapping[str, str] = MappingProxyType(
    {"content-type": "application/json", "accept": "text/event-stream"}
)
JSON_CALL_HEADERS: Mapping[str, str] = MappingProxyType(
    {"content-type": "application/json", "accept": "application/json"}
)
# json.dumps with an argument builds a new encoder per call; this one is built once (it keeps
# no state between calls), with json.dumps's defaults otherwise.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def _client_fields(request: ChatRequest, provider: ProviderConfig) -> dict[str, Any]:
    """What of the client's body goes upstream as it is; with ``priority_scheduling``, the
    request's priority as vLLM's ``priority`` (a client's own is a gateway field, never sent:
    core/priority.py)."""
    strip = provider.strip_fields
    body = {k: v for k, v in request.body.items() if k not in DROPPED_FIELDS and k not in strip}
    if provider.priority_scheduling:
        body["priority"] = request.priority
    return body


def build_body(request: ChatRequest, provider: ProviderConfig) -> dict[str, Any]:
    """The body sent upstream. The upstream is always asked to stream, with usage."""
    body = _client_fields(request, provider)
    if "messages" in body:
        body["messages"] = without_reasoning_details(body["messages"])
    body["model"] = provider.model
    body["stream"] = True
    _clamp_output(body, provider)
    # Without include_usage vLLM reports no token counts at all on a stream; with
    # continuous_usage_stats every chunk carries the cumulative counts, so a stream cut short is
    # billed exactly up to its last chunk. The front decides whether the client sees usage.
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if request.reasoning is not None and Capability.REASONING in provider.capabilities:
        template_kwargs = body.get("chat_template_kwargs")
        merged = dict(template_kwargs) if isinstance(template_kwargs, dict) else {}
        merged["enable_thinking"] = request.reasoning
        body["chat_template_kwargs"] = merged
    return body


def _clamp_output(body: dict[str, Any], provider: ProviderConfig) -> None:
    """The client's output limit, lowered to the provider's ``max_output_tokens`` when the
    operator set it: vLLM refuses a ``max_tokens`` above its ``max_model_len``, and agents ask
    for more than a small context holds (Claude Code: 32000 on every turn)."""
    cap = known_output_cap(provider)
    if cap is None:
        return
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if type(value) is int and value > cap:
            body[key] = cap


class ChunkParser(OpenAIStream):
    """One upstream stream's ``chat.completion.chunk`` payloads → gateway events.

    Feed each SSE ``data`` payload to :meth:`feed`; :meth:`close` at the end of the byte stream.
    Raises :class:`GatewayError` for in-band upstream errors and malformed chunks.
    """

    def __init__(self, provider: str) -> None:
        super().__init__(provider)
        self._tool_calls = ToolCallAssembler()

    def feed_data(self, data: bytes) -> list[Event]:
        if data == b"[DONE]":
            return self._finish()
        if self._done:
            raise UpstreamProtocolError(
                f"{self._provider} sent data after [DONE]", provider=self._provider
            )
        try:
            chunk = json_data(data)
        except ValueError as exc:
            raise UpstreamProtocolError(
                f"{self._provider} sent a chunk that is not JSON: {exc}", provider=self._provider
            ) from None
        if not isinstance(chunk, dict):
            raise UpstreamProtocolError(
                f"{self._provider} sent a chunk that is not an object", provider=self._provider
            )
        if "error" in chunk or chunk.get("object") == "error":
            # Either shape, {"error": {...}} or an error object itself: the classifier unwraps.
            raise classify_inband(self._provider, chunk)
        events: list[Event] = []
        if not self._started:
            self._started = True
            events.append(ResponseStarted(provider=self._provider))
        choices = chunk.get("choices")
        if choices:
            if not isinstance(choices, list):
                raise self._malformed("'choices' is not a list")
            self._choice(choices[0], events)
        usage = chunk.get("usage")
        # With continuous usage stats every chunk carries usage; only the closing one
        # (no choices) is the total. The others are kept as they are: one assignment.
        if isinstance(usage, dict):
            self._usage = usage
            self._unmetered = 0
            if not choices:
                events.append(parse_usage(usage))
        return events

    def _malformed(self, what: str) -> UpstreamProtocolError:
        return UpstreamProtocolError(
            f"{self._provider} sent a malformed chunk: {what}", provider=self._provider
        )

    def _text(self, value: object, what: str) -> str | None:
        if value is None or type(value) is str:
            return value
        raise self._malformed(f"{what} is not a string")

    def _choice(self, choice: object, events: list[Event]) -> None:
        if not isinstance(choice, dict):
            raise self._malformed("a choice is not an object")
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise self._malformed("'delta' is not an object")
        reasoning = self._text(delta.get("reasoning_content"), "reasoning_content") or self._text(
            delta.get("reasoning"), "reasoning"
        )
        if reasoning:
            events.append(ReasoningDelta(text=reasoning))
            self._unmetered += 1
        content = self._text(delta.get("content"), "content")
        if content:
            events.append(TextDelta(text=content))
            self._unmetered += 1
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            if not isinstance(tool_calls, list):
                raise self._malformed("'tool_calls' is not a list")
            for fragment in tool_calls:
                events.append(self._tool_call(fragment))
            self._unmetered += 1
        finish_reason = self._text(choice.get("finish_reason"), "finish_reason")
        if finish_reason:
            self._finish_reason = finish_reason
            stop_reason = choice.get("stop_reason")
            if isinstance(stop_reason, str) and stop_reason:
                self._stop_sequence = stop_reason
            events.extend(self._tool_calls.finish())

    def _tool_call(self, fragment: object) -> ToolCallDelta:
        if not isinstance(fragment, dict):
            raise self._malformed("a tool call fragment is not an object")
        function = fragment.get("function") or {}
        if not isinstance(function, dict):
            raise self._malformed("a tool call's 'function' is not an object")
        index = fragment.get("index", 0)
        if type(index) is not int or not 0 <= index < MAX_TOOL_CALLS:
            raise self._malformed(f"tool call index {index!r}")
        event = ToolCallDelta(
            index=index,
            id=self._text(fragment.get("id"), "a tool call id"),
            name=self._text(function.get("name"), "a tool call name"),
            arguments=self._text(function.get("arguments"), "tool call arguments") or "",
        )
        try:
            self._tool_calls.add(event)
        except ValueError as exc:
            raise self._malformed(str(exc)) from None
        return event


def parse_completion(provider: str, body: bytes) -> list[Event]:
    """A whole ``chat.completion`` object (a server that answered a stream request without
    streaming) → the events its stream would have given."""
    try:
        completion = json.loads(body)
        choice = completion["choices"][0]
        message = choice["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise UpstreamProtocolError(
            f"{provider} sent a whole answer that is not a chat completion", provider=provider
        ) from None
    parser = ChunkParser(provider)
    delta = (
        {k: v for k, v in message.items() if k != "tool_calls"} if isinstance(message, dict) else {}
    )
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if isinstance(calls, list):
        delta["tool_calls"] = [
            {**call, "index": i} if isinstance(call, dict) else call for i, call in enumerate(calls)
        ]
    events = parser.feed_data(
        json.dumps(
            {"choices": [{"delta": delta, "finish_reason": choice.get("finish_reason")}]}
        ).encode()
    )
    usage = completion.get("usage")
    if isinstance(usage, dict):
        # The closing chunk of a stream: usage, no choices.
        events += parser.feed_data(json.dumps({"usage": usage}).encode())
    return events + parser.feed_data(b"[DONE]")


def build_completions_body(request: ChatRequest, provider: ProviderConfig) -> dict[str, Any]:
    """A ``/v1/completions`` body: streamed with usage, as a chat body is."""
    body = _client_fields(request, provider)
    body["model"] = provider.model
    body["stream"] = True
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return body


def build_embeddings_body(request: ChatRequest, provider: ProviderConfig) -> dict[str, Any]:
    """A ``/v1/embeddings`` body: the client's, for the provider's model (nothing streams)."""
    body = _client_fields(request, provider)
    body["model"] = provider.model
    return body


class OpenAICompatibleDialect:
    """vLLM and the servers that speak its dialect: the request passes through nearly as is.
    One method per kind of request; the other kinds' answers are read by a ``KindReader``."""

    def build_call(self, request: ChatRequest, provider: ProviderConfig) -> UpstreamCall:
        if request.kind is RequestKind.COMPLETIONS:
            return self.build_completions_call(request, provider)
        if request.kind is RequestKind.EMBEDDINGS:
            return self.build_embeddings_call(request, provider)
        return self.build_chat_call(request, provider)

    def build_chat_call(self, request: ChatRequest, provider: ProviderConfig) -> UpstreamCall:
        return UpstreamCall(
            url=provider.endpoint + "/chat/completions",
            body=_ENCODER.encode(build_body(request, provider)).encode(),
            headers=CALL_HEADERS,
            # vLLM honours the flag only in what it returns, not in what it generates.
            first_tool_call_only=request.body.get("parallel_tool_calls") is False,
        )

    def build_completions_call(
        self, request: ChatRequest, provider: ProviderConfig
    ) -> UpstreamCall:
        return UpstreamCall(
            url=provider.endpoint + "/completions",
            body=_ENCODER.encode(build_completions_body(request, provider)).encode(),
            headers=CALL_HEADERS,
            reader=KindReader(RequestKind.COMPLETIONS, self.classify_error),
        )

    def build_embeddings_call(self, request: ChatRequest, provider: ProviderConfig) -> UpstreamCall:
        return UpstreamCall(
            url=provider.endpoint + "/embeddings",
            body=_ENCODER.encode(build_embeddings_body(request, provider)).encode(),
            headers=JSON_CALL_HEADERS,
            reader=KindReader(RequestKind.EMBEDDINGS, self.classify_error),
            max_whole_bytes=MAX_EMBEDDINGS_BYTES,
        )

    def max_output_tokens(self, request: ChatRequest, provider: ProviderConfig) -> int:
        if request.kind is RequestKind.EMBEDDINGS:
            return 0  # an embedding generates nothing
        if request.kind is RequestKind.COMPLETIONS:
            # Each prompt, n times, may generate max_tokens (the vendors' default: 16).
            limit = request.body.get("max_tokens")
            per_choice = limit if type(limit) is int else COMPLETIONS_DEFAULT_MAX_TOKENS
            return per_choice * completion_choices(request.body)
        # The client's limit goes as is (OpenAI: as max_completion_tokens); without one, the
        # model's cap (vLLM: the context left, unknown here: see held_output_tokens).
        held = held_output_tokens(request.body, provider)
        cap = known_output_cap(provider)
        return held if cap is None else min(held, cap)

    def new_parser(self, provider: str) -> ChunkParser:
        return ChunkParser(provider)

    def parse_whole(self, provider: str, body: bytes) -> list[Event]:
        return parse_completion(provider, body)

    def classify_error(
        self, provider: str, status: int, body: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        return classify_status(provider, status, body, headers.get("retry-after"))

    def auth_headers(self, credential: str) -> dict[str, str]:
        return {"authorization": f"Bearer {credential}"}
