"""The ``anthropic`` provider type: Anthropic's Messages API as a :class:`Dialect`. Pure.

Request translation lives in ``anthropic_request.py`` (its docstring tables every OpenAI field);
here are the stream parser, the whole-answer parser and the error classification.

Stream grammar (``POST /v1/messages`` with ``stream: true``): ``message_start`` (input and cache
usage) · per content block ``content_block_start`` / ``content_block_delta``* /
``content_block_stop`` · ``ping`` at any time · ``message_delta`` (stop_reason, cumulative
usage) · ``message_stop``. An error after the 200 arrives as ``event: error`` and the body then
ends without ``message_stop``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import GatewayError, UpstreamProtocolError
from trio_gateway.core.events import (
    Event,
    ReasoningDelta,
    ReasoningDetail,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from trio_gateway.core.reasoning_details import ANTHROPIC, MAX_DETAILS
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.sse import SSEEvent, json_data
from trio_gateway.core.toolcalls import ToolCallAssembler
from trio_gateway.core.usage import PartialUsage, estimate_tokens
from trio_gateway.providers.anthropic.errors import classify_error, classify_stream_error
from trio_gateway.providers.anthropic.extras import beta_headers
from trio_gateway.providers.anthropic.model_rules import apply_model_rules
from trio_gateway.providers.anthropic.request import (
    DROPPED_FIELDS,
    REFUSED_FIELDS,
    build_body,
    requested_max_tokens,
)
from trio_gateway.providers.dialect import UpstreamCall, chat_only

__all__ = [
    "API_VERSION",
    "DROPPED_FIELDS",
    "FINISH_REASONS",
    "REFUSED_FIELDS",
    "AnthropicDialect",
    "AnthropicStreamParser",
    "build_body",
    "classify_error",
    "classify_stream_error",
]

API_VERSION: Final = "2023-06-01"
# More parallel tool calls than any model makes: a bound on what one answer may hold.
MAX_TOOL_CALLS: Final = 128
# Anthropic streams one block at a time; a few open at once is tolerated, more is a broken
# stream (and would be memory the parser keeps for nothing).
MAX_OPEN_BLOCKS: Final = 16
# A thinking block's text is kept until its signature arrives, to be handed back whole (as a
# reasoning detail); more than any max_tokens lets a model think is a broken stream.
MAX_THINKING_CHARS: Final = 4 * 1024 * 1024

# stop_reason → OpenAI finish_reason. pause_turn (a server tool's long turn, which the gateway
# never asks for) ends the answer as it stands; an unknown reason is taken as a plain stop.
FINISH_REASONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "end_turn": "stop",
        "stop_sequence": "stop",
        "pause_turn": "stop",
        "max_tokens": "length",
        "model_context_window_exceeded": "length",
        "tool_use": "tool_calls",
        "refusal": "content_filter",
    }
)

# --- the stream --------------------------------------------------------------------------------


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


class _Block:
    """An open content block: what its deltas become."""

    __slots__ = ("has_arguments", "kind", "signature", "thinking", "thinking_chars", "tool_index")

    def __init__(self, kind: str, tool_index: int = -1) -> None:
        self.kind = kind  # "text", "thinking", "tool_use", or "other" (deltas ignored)
        self.tool_index = tool_index
        self.has_arguments = False
        # A thinking block's text and signature, handed back whole when it stops.
        self.thinking: list[str] = []
        self.thinking_chars = 0
        self.signature: str | None = None


class AnthropicStreamParser:
    """One answer's SSE events → gateway events (the order of ``providers/dialect.py``).

    The event's type is read from its JSON ``type`` (as the SDK does), so a missing ``event:``
    line does not matter. Unknown event, block and delta types are ignored: Anthropic adds
    them (server tools, citations) and says clients should skip what they do not know.
    """

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._started = False
        self._done = False
        self._blocks: dict[int, _Block] = {}
        self._next_index = 0
        self._tool_calls = ToolCallAssembler()
        self._tool_count = 0
        self._details = 0  # reasoning details given so far: the next one's index
        self._stop_reason: str | None = None
        self._stop_sequence: str | None = None
        self._input_tokens = 0
        self._cache_read: int | None = None
        self._cache_creation: int | None = None
        self._output_tokens = 0
        self._thinking_tokens: int | None = None
        # For a stream cut before message_delta: the characters streamed so far.
        self._output_final = False
        self._streamed_chars = 0

    @property
    def done(self) -> bool:
        return self._done

    def usage_so_far(self) -> PartialUsage | None:
        """The input side is exact from ``message_start``; the output count is cumulative only
        in ``message_delta``, at the end. Before it: the characters streamed / 4, estimated."""
        if not self._started:
            return None
        usage = self._usage_event()
        if self._output_final:
            return PartialUsage(usage, estimated=False)
        streamed = estimate_tokens(self._streamed_chars)
        completion = max(usage.completion_tokens, streamed)
        return PartialUsage(attrs.evolve(usage, completion_tokens=completion), estimated=True)

    def feed(self, event: SSEEvent) -> list[Event]:
        if not event.data:
            return []
        if self._done:
            raise self._malformed("data after message_stop")
        try:
            payload = json_data(event.data)
        except ValueError as exc:
            raise self._malformed(f"an event that is not JSON ({exc})") from None
        if not isinstance(payload, dict):
            raise self._malformed("an event that is not an object")
        return self.handle(payload, event.event)

    def close(self) -> list[Event]:
        if self._done:
            return []
        raise UpstreamProtocolError(
            f"{self._provider} closed the stream before message_stop", provider=self._provider
        )

    def _malformed(self, what: str) -> UpstreamProtocolError:
        return UpstreamProtocolError(
            f"{self._provider} sent a malformed stream: {what}", provider=self._provider
        )

    def handle(self, payload: dict[str, Any], name: str | None = None) -> list[Event]:
        """One decoded event (also how :func:`parse_whole` replays a whole message)."""
        kind = payload.get("type", name)
        if kind == "error":
            raise classify_stream_error(self._provider, payload.get("error"))
        if kind == "message_start":
            return self._message_start(payload)
        if kind == "ping" or not isinstance(kind, str):
            return []
        if not self._started and kind in (
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ):
            raise self._malformed(f"{kind} before message_start")
        if kind == "content_block_start":
            return self._block_start(payload)
        if kind == "content_block_delta":
            return self._block_delta(payload)
        if kind == "content_block_stop":
            return self._block_stop(payload)
        if kind == "message_delta":
            self._message_delta(payload)
            return []
        if kind == "message_stop":
            return self._finish()
        return []

    def _object(self, payload: Mapping[str, Any], key: str) -> dict[str, Any]:
        value = payload.get(key)
        if not isinstance(value, dict):
            raise self._malformed(f"{payload.get('type')} without a {key!r} object")
        return value

    def _text(self, value: object, what: str) -> str:
        if value is None:
            return ""
        if type(value) is not str:
            raise self._malformed(f"{what} is not a string")
        return value

    def _usage(self, usage: object) -> None:
        # message_start has the input side; message_delta's counts are cumulative and, on newer
        # models, repeat the input side too: the last value seen is the total.
        if not isinstance(usage, dict):
            return
        if (value := _count(usage.get("input_tokens"))) is not None:
            self._input_tokens = value
        if (value := _count(usage.get("cache_read_input_tokens"))) is not None:
            self._cache_read = value
        if (value := _count(usage.get("cache_creation_input_tokens"))) is not None:
            self._cache_creation = value
        if (value := _count(usage.get("output_tokens"))) is not None:
            self._output_tokens = value
        details = usage.get("output_tokens_details")
        if (
            isinstance(details, dict)
            and (value := _count(details.get("thinking_tokens"))) is not None
        ):
            self._thinking_tokens = value

    def _message_start(self, payload: Mapping[str, Any]) -> list[Event]:
        if self._started:
            raise self._malformed("a second message_start")
        message = self._object(payload, "message")
        self._started = True
        self._usage(message.get("usage"))
        return [ResponseStarted(provider=self._provider)]

    def _index(self, payload: Mapping[str, Any]) -> int:
        index = payload.get("index")
        if type(index) is not int or index < 0:
            raise self._malformed(f"{payload.get('type')} with index {index!r}")
        return index

    def _open(self, payload: Mapping[str, Any]) -> _Block:
        index = self._index(payload)
        block = self._blocks.get(index)
        if block is None:
            raise self._malformed(f"{payload.get('type')} for block {index}, which is not open")
        return block

    def _block_start(self, payload: Mapping[str, Any]) -> list[Event]:
        index = self._index(payload)
        # Indices only grow: a reused one would be a second block under the same number.
        if index < self._next_index:
            raise self._malformed(f"content_block_start for block {index} again")
        if len(self._blocks) >= MAX_OPEN_BLOCKS:
            raise self._malformed(f"more than {MAX_OPEN_BLOCKS} blocks open at once")
        self._next_index = index + 1
        content = self._object(payload, "content_block")
        kind = content.get("type")
        if kind == "text":
            self._blocks[index] = _Block("text")
            text = self._text(content.get("text"), "a text block's text")
            return [TextDelta(text=text)] if text else []
        if kind == "thinking":
            block = self._blocks[index] = _Block("thinking")
            text = self._text(content.get("thinking"), "a thinking block's thinking")
            self._keep_thinking(block, text)
            # A whole message (parse_whole) has the signature here; a stream has it in a delta.
            signature = content.get("signature")
            if signature:
                block.signature = self._text(signature, "a thinking block's signature")
            return [ReasoningDelta(text=text)] if text else []
        if kind == "tool_use":
            return self._tool_start(index, content)
        self._blocks[index] = _Block("other")
        if kind == "redacted_thinking":
            # Encrypted, nothing to show; but the vendor needs it back, untouched.
            data = self._text(content.get("data"), "a redacted_thinking block's data")
            return [self._detail(data=data)] if data else []
        # Server tools' blocks, and any new kind.
        return []

    def _detail(self, **fields: str | None) -> ReasoningDetail:
        if self._details >= MAX_DETAILS:
            raise self._malformed(f"more than {MAX_DETAILS} thinking blocks")
        detail = ReasoningDetail(self._details, ANTHROPIC, **fields)
        self._details += 1
        return detail

    def _keep_thinking(self, block: _Block, text: str) -> None:
        block.thinking_chars += len(text)
        if block.thinking_chars > MAX_THINKING_CHARS:
            raise self._malformed(f"a thinking block of more than {MAX_THINKING_CHARS} characters")
        block.thinking.append(text)

    def _tool_start(self, index: int, content: Mapping[str, Any]) -> list[Event]:
        if self._tool_count >= MAX_TOOL_CALLS:
            raise self._malformed(f"more than {MAX_TOOL_CALLS} tool calls")
        tool_id = self._text(content.get("id"), "a tool_use id")
        name = self._text(content.get("name"), "a tool_use name")
        if not tool_id or not name:
            raise self._malformed("a tool_use block without an id or a name")
        block = _Block("tool_use", self._tool_count)
        self._tool_count += 1
        self._blocks[index] = block
        # A stream starts every tool_use with `input: {}` and sends the input as deltas; a
        # whole message (parse_whole) has it here.
        initial = content.get("input")
        arguments = json.dumps(initial, ensure_ascii=False) if initial else ""
        block.has_arguments = bool(arguments)
        return [self._tool_delta(ToolCallDelta(block.tool_index, tool_id, name, arguments))]

    def _tool_delta(self, delta: ToolCallDelta) -> ToolCallDelta:
        try:
            self._tool_calls.add(delta)
        except ValueError as exc:  # the assembler's bound on argument size
            raise self._malformed(str(exc)) from None
        return delta

    def _block_delta(self, payload: Mapping[str, Any]) -> list[Event]:
        block = self._open(payload)
        delta = self._object(payload, "delta")
        kind = delta.get("type")
        if kind == "signature_delta" and block.kind == "thinking":
            block.signature = self._text(delta.get("signature"), "a signature_delta's signature")
            return []
        if block.kind == "other" or kind in ("signature_delta", "citations_delta"):
            return []
        if kind == "text_delta" and block.kind == "text":
            text = self._text(delta.get("text"), "a text_delta's text")
            self._streamed_chars += len(text)
            return [TextDelta(text=text)] if text else []
        if kind == "thinking_delta" and block.kind == "thinking":
            text = self._text(delta.get("thinking"), "a thinking_delta's thinking")
            self._streamed_chars += len(text)
            self._keep_thinking(block, text)
            return [ReasoningDelta(text=text)] if text else []
        if kind == "input_json_delta" and block.kind == "tool_use":
            fragment = self._text(delta.get("partial_json"), "a partial_json")
            self._streamed_chars += len(fragment)
            if not fragment:
                return []
            block.has_arguments = True
            return [self._tool_delta(ToolCallDelta(block.tool_index, None, None, fragment))]
        if kind in ("text_delta", "thinking_delta", "input_json_delta"):
            raise self._malformed(f"a {kind} in a {block.kind} block")
        return []

    def _block_stop(self, payload: Mapping[str, Any]) -> list[Event]:
        block = self._open(payload)
        del self._blocks[self._index(payload)]
        if block.kind == "tool_use" and not block.has_arguments:
            # A call without input: its arguments are "{}", as an OpenAI client expects them
            # (it concatenates the fragments and parses the result).
            block.has_arguments = True
            return [self._tool_delta(ToolCallDelta(block.tool_index, None, None, "{}"))]
        if block.kind == "thinking" and block.signature:
            # Signed: what Anthropic needs back, as it was, for thinking to go on in a tool
            # loop. An unsigned block could not be sent back, so it is not offered.
            return [self._detail(text="".join(block.thinking), signature=block.signature)]
        return []

    def _message_delta(self, payload: Mapping[str, Any]) -> None:
        delta = self._object(payload, "delta")
        stop_reason = delta.get("stop_reason")
        if stop_reason is not None:
            self._stop_reason = self._text(stop_reason, "stop_reason")
        stop_sequence = delta.get("stop_sequence")
        if isinstance(stop_sequence, str) and stop_sequence:
            self._stop_sequence = stop_sequence
        usage = payload.get("usage")
        self._usage(usage)
        # message_delta's output count is cumulative and final: exact from here on.
        self._output_final = isinstance(usage, dict) and "output_tokens" in usage

    def _finish(self) -> list[Event]:
        if self._stop_reason is None:
            raise self._malformed("message_stop without a stop_reason")
        self._done = True
        finish_reason = FINISH_REASONS.get(self._stop_reason, "stop")
        if self._tool_count and finish_reason == "stop":
            # The answer ends in tool calls whatever the vendor named its stop.
            finish_reason = "tool_calls"
        events: list[Event] = list(self._tool_calls.finish())
        events.append(self._usage_event())
        stop_sequence = self._stop_sequence if finish_reason == "stop" else None
        events.append(ResponseDone(finish_reason=finish_reason, stop_sequence=stop_sequence))
        return events

    def _usage_event(self) -> Usage:
        cache_read = self._cache_read or 0
        return Usage(
            # Anthropic's input_tokens exclude the cache; OpenAI's prompt tokens hold it.
            prompt_tokens=self._input_tokens + cache_read + (self._cache_creation or 0),
            completion_tokens=self._output_tokens,
            reasoning_tokens=self._thinking_tokens,
            cached_tokens=self._cache_read,
        )


def parse_whole(provider: str, body: bytes) -> list[Event]:
    """A whole Message (``stream: false``) → the events its stream would have given.

    The message is replayed through the stream parser as the events Anthropic would have
    streamed, so both paths share every check and every mapping.
    """
    parser = AnthropicStreamParser(provider)
    try:
        message = json.loads(body)
    except ValueError as exc:
        raise UpstreamProtocolError(
            f"{provider} sent an answer that is not JSON ({exc})", provider=provider
        ) from None
    if not isinstance(message, dict):
        raise UpstreamProtocolError(
            f"{provider} sent an answer that is not an object", provider=provider
        )
    if message.get("type") == "error":
        raise classify_stream_error(provider, message.get("error"))
    content = message.get("content")
    if not isinstance(content, list):
        raise UpstreamProtocolError(f"{provider} sent a message without content", provider=provider)
    usage = message.get("usage")
    events = parser.handle({"type": "message_start", "message": {"usage": usage}})
    for index, block in enumerate(content):
        events += parser.handle(
            {"type": "content_block_start", "index": index, "content_block": block}
        )
        events += parser.handle({"type": "content_block_stop", "index": index})
    stops = {key: message.get(key) for key in ("stop_reason", "stop_sequence")}
    delta = {"type": "message_delta", "delta": stops}
    events += parser.handle(delta | {"usage": usage})
    events += parser.handle({"type": "message_stop"})
    return events


class AnthropicDialect:
    """Anthropic's Messages API (``providers/dialect.py``'s protocol)."""

    def build_call(self, request: ChatRequest, provider: ProviderConfig) -> UpstreamCall:
        chat_only(request, "Anthropic")
        body = apply_model_rules(build_body(request, provider), provider)
        return UpstreamCall(
            url=provider.endpoint + "/v1/messages",
            body=json.dumps(body, ensure_ascii=False).encode(),
            headers={
                "anthropic-version": API_VERSION,
                "content-type": "application/json",
                "accept": "text/event-stream",
                **beta_headers(request.body),
            },
        )

    def max_output_tokens(self, request: ChatRequest, provider: ProviderConfig) -> int:
        # The max_tokens sent: thinking comes out of it.
        return requested_max_tokens(request.body, provider)

    def new_parser(self, provider: str) -> AnthropicStreamParser:
        return AnthropicStreamParser(provider)

    def parse_whole(self, provider: str, body: bytes) -> list[Event]:
        return parse_whole(provider, body)

    def classify_error(
        self, provider: str, status: int, body: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        return classify_error(provider, status, body, headers)

    def auth_headers(self, credential: str) -> dict[str, str]:
        return {"x-api-key": credential}
