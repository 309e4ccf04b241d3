"""The Messages front's encoders: gateway events → Anthropic's stream events, as SSE or folded
into one ``message``; and errors in Anthropic's shape. Pure.

One state machine (:class:`MessageBuilder`) turns each gateway event into the Anthropic
events it means, and both answers are made from it: a streamed answer writes them as SSE, a
whole one folds them as the ``anthropic`` SDK's own accumulator does (``accumulate_event``), so
the two cannot disagree. The grammar (docs/api.md, "Anthropic Messages"): ``message_start``,
``ping``, per content block ``content_block_start`` / ``content_block_delta`` (``text_delta``,
``thinking_delta``, ``signature_delta``, ``input_json_delta``) / ``content_block_stop``, then
``message_delta`` (``stop_reason``, usage) and ``message_stop``. An error once the stream began
is an ``error`` event, after which nothing follows (Anthropic ends the body there too).

Reasoning, for a request that enabled thinking (for another, none: :class:`MessageBuilder`):
readable thinking (``ReasoningDelta``) is a ``thinking`` block; an Anthropic
provider's signed block ends it with its ``signature_delta``, a redacted one is a
``redacted_thinking`` block. Another vendor's detail (a Gemini thought signature, bound to a
tool call) has no Anthropic form: it rides in a thinking block's ``signature`` as
:data:`SIGNATURE_PREFIX` + base64url of its ``reasoning_details`` entry, which the front reads
back when the client returns the block (``messages_request.py``).
"""

from __future__ import annotations

import base64
import binascii
import json
from json.encoder import encode_basestring
from typing import Any, Final

from trio_gateway.core.errors import GatewayError
from trio_gateway.core.events import (
    CompletionText,
    Embeddings,
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
from trio_gateway.core.reasoning_details import ANTHROPIC, detail_object
from trio_gateway.providers.toolcall_stop import ObjectEnd

Json = dict[str, Any]

SIGNATURE_PREFIX: Final = "tgw1."
# finish_reason → stop_reason. "stop" is end_turn, or stop_sequence when the vendor named the
# client's stop sequence that ended it (ResponseDone.stop_sequence).
STOP_REASONS: Final = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
# Anthropic's error types by status (https://docs.claude.com/en/api/errors); a status not
# listed is invalid_request_error below 500 and api_error from 500, as Anthropic says it does.
ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# The gateway's 503s (no slot, every provider down, draining) say "try again later", which is
# what Anthropic's clients read from a 529: they back off and retry it.
OVERLOADED_STATUS: Final = 529

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(obj: Any) -> str:
    return _ENCODER.encode(obj)


# --- errors ------------------------------------------------------------------------------------


def anthropic_status(error: GatewayError) -> int:
    return OVERLOADED_STATUS if error.status == 503 else error.status


def anthropic_error_body(error: GatewayError) -> Json:
    status = anthropic_status(error)
    kind = ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    body: Json = {"type": "error", "error": {"type": kind, "message": error.message}}
    if error.request_id is not None:
        body["request_id"] = error.request_id
    return body


def anthropic_error(error: GatewayError) -> tuple[int, Any]:
    """The Messages front's :data:`~trio_gateway.fronts.http.ErrorShape`."""
    return anthropic_status(error), anthropic_error_body(error)


def sse(event: Json) -> bytes:
    return f"event: {event['type']}\ndata: {dumps(event)}\n\n".encode()


def anthropic_stream_error(error: GatewayError) -> bytes:
    """An error once the stream began: an ``error`` event, and the stream ends there."""
    return sse(anthropic_error_body(error))


# --- signatures of other vendors --------------------------------------------------------------


def encode_signature(detail: ReasoningDetail) -> str:
    """Another vendor's reasoning detail as a thinking block's ``signature``."""
    raw = dumps(detail_object(detail)).encode()
    return SIGNATURE_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_signature(signature: str) -> Json | None:
    """The ``reasoning_details`` entry a :func:`encode_signature` signature holds; None for a
    signature that is not one (an Anthropic signature). ValueError: ours, but broken."""
    if not signature.startswith(SIGNATURE_PREFIX):
        return None
    text = signature[len(SIGNATURE_PREFIX) :]
    try:
        entry = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ValueError("not a signature the gateway wrote") from None
    if not isinstance(entry, dict):
        raise ValueError("not a signature the gateway wrote")
    return entry


# --- the state machine -------------------------------------------------------------------------


def stop_reason(finish_reason: str) -> str:
    return STOP_REASONS.get(finish_reason, "end_turn")


def usage_fields(usage: Usage | None) -> Json:
    """Anthropic's usage: ``input_tokens`` excludes what the cache served, which is
    ``cache_read_input_tokens`` (known only where the vendor counted it)."""
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    cached = usage.cached_tokens
    out: Json = {
        "input_tokens": usage.prompt_tokens - (cached or 0),
        "output_tokens": usage.completion_tokens,
    }
    if cached is not None:
        out["cache_read_input_tokens"] = cached
    if usage.reasoning_tokens is not None:
        out["output_tokens_details"] = {"thinking_tokens": usage.reasoning_tokens}
    return out


class MessageBuilder:
    """Gateway events → Anthropic stream events (dicts), for one answer.

    Whitespace before a text block's first visible character is not written: Qwen3 writes
    ``"\\n\\n"`` after its thinking, before the answer or a tool call, and Anthropic refuses a
    whitespace-only text block when the client sends the turn back.

    Thinking is written only when the request enabled it (``thinking``): Anthropic sends no
    thinking block to a request that did not ask, and clients warn about one they did not ask
    for. The reasoning is dropped then (its tokens still count in ``output_tokens``: they were
    generated).

    One block is open at a time, and each tool call is one ``tool_use`` block. A Chat
    Completions upstream may interleave the fragments of several calls (``index`` 0, 1, 0, 1
    …), so while a call is open and not known whole, everything that would open another block
    (another call's fragments, text, thinking) is held, in order, and written once the call is
    whole: its arguments have closed their JSON object (:class:`ObjectEnd`), or its
    ``ToolCallDone`` came, or the answer ended. A call whose arguments close before the next
    call begins (every upstream that does not interleave) holds nothing back. What is held is
    a part of this answer's output, so it is bounded as the answer is: by the request's
    ``max_tokens`` (lowered to the provider's output cap), and each call's arguments by the
    tool-call assembler's 1 MiB; an answer that ends in an error drops it."""

    def __init__(
        self, *, message_id: str, model: str, input_tokens: int, thinking: bool = True
    ) -> None:
        self._message_id = message_id
        self._model = model
        self._input_tokens = input_tokens
        self._show_thinking = thinking
        self._index = -1
        self._open: str | None = None  # the type of the open block
        self._open_tool: int | None = None  # the tool call index of an open tool_use block
        self._signed = False  # the open thinking block's signature_delta was written
        self._arguments = ObjectEnd()  # the open tool call's arguments, as they close
        self._written: set[int] = set()  # tool calls whose block has begun
        self._whole: set[int] = set()  # tool calls the answer said are whole (ToolCallDone)
        self._all_whole = False  # the answer ended: every call is as whole as it will be
        self._held: list[Event] = []  # what waits for the open tool call to be whole
        self._usage: Usage | None = None
        self.started = False
        self.ended = False

    def start(self) -> list[Json]:
        if self.started:
            return []
        self.started = True
        message: Json = {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._input_tokens, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    @property
    def open_block(self) -> str | None:
        """The type of the block a delta goes to now, if one is open."""
        return self._open

    @property
    def open_index(self) -> int:
        return self._index

    def _close(self) -> list[Json]:
        if self._open is None:
            return []
        out: list[Json] = []
        if self._open == "thinking" and not self._signed:
            # Anthropic ends every thinking block with its signature_delta, and clients (the
            # AI SDK) drop, with a warning, a streamed thinking block that had none when they
            # send the turn back. A provider that does not sign (vLLM) gets the empty
            # signature its whole answer carries.
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        self._open = None
        self._open_tool = None
        out.append({"type": "content_block_stop", "index": self._index})
        return out

    def _begin(self, block: Json) -> list[Json]:
        out = self._close()
        self._index += 1
        self._open = block["type"]
        self._signed = False
        out.append({"type": "content_block_start", "index": self._index, "content_block": block})
        return out

    def _delta(self, delta: Json) -> Json:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _text(self, text: str) -> list[Json]:
        if self._open != "text":
            if not text.strip():
                return []
            out = self._begin({"type": "text", "text": ""})
        else:
            out = []
        out.append(self._delta({"type": "text_delta", "text": text}))
        return out

    def _thinking(self, text: str) -> list[Json]:
        out = [] if self._open == "thinking" else self._begin(_thinking_start())
        if text:
            out.append(self._delta({"type": "thinking_delta", "thinking": text}))
        return out

    def _detail(self, detail: ReasoningDetail) -> list[Json]:
        if detail.format == ANTHROPIC and detail.data is not None:
            out = self._begin({"type": "redacted_thinking", "data": detail.data})
            return out + self._close()
        if detail.format == ANTHROPIC:
            signature = detail.signature or ""
            out = [] if self._open == "thinking" else self._thinking(detail.text or "")
        else:
            signature = encode_signature(detail)
            out = [] if self._open == "thinking" else self._begin(_thinking_start())
        out.append(self._delta({"type": "signature_delta", "signature": signature}))
        self._signed = True
        return out + self._close()

    def _tool(self, event: ToolCallDelta) -> list[Json]:
        if event.index != self._open_tool:
            if event.index in self._written:
                # Its block was closed once its arguments closed their object: what follows
                # that is whitespace, or not JSON, and has no place in the input.
                return []
            block = {
                "type": "tool_use",
                "id": event.id or "",
                "name": event.name or "",
                "input": {},
            }
            out = self._begin(block)
            self._open_tool = event.index
            self._arguments = ObjectEnd()
            self._written.add(event.index)
        else:
            out = []
        if event.arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": event.arguments}))
            if self._arguments.feed(event.arguments) and self._held:
                out += self._release()
        return out

    def _open_call_is_whole(self) -> bool:
        index = self._open_tool
        return index is None or self._all_whole or index in self._whole or self._arguments.closed

    def _content(self, event: Event) -> list[Json]:
        """A piece of the answer's content, written now or held behind the open tool call."""
        thinking = type(event) is ReasoningDelta or isinstance(event, ReasoningDetail)
        if thinking and not self._show_thinking:
            return []
        own = isinstance(event, ToolCallDelta) and event.index == self._open_tool
        if not own and (self._held or not self._open_call_is_whole()):
            self._held.append(event)
            return []
        if type(event) is TextDelta:
            return self._text(event.text)
        if type(event) is ReasoningDelta:
            return self._thinking(event.text)
        if isinstance(event, ReasoningDetail):
            return self._detail(event)
        assert isinstance(event, ToolCallDelta)
        return self._tool(event)

    def _release(self) -> list[Json]:
        """The open call is whole: its block ends, and what it held back is written (a later
        call among it may hold back the rest again)."""
        out = self._close()
        held, self._held = self._held, []
        for event in held:
            out += self._content(event)
        return out

    def feed(self, event: Event) -> list[Json]:
        if self.ended:
            return []
        if not self.started and not isinstance(event, ResponseStarted):
            # Every provider starts with ResponseStarted; were one not to, the grammar holds.
            return self.start() + self.feed(event)
        if isinstance(event, TextDelta | ReasoningDelta | ReasoningDetail | ToolCallDelta):
            return self._content(event)
        if isinstance(event, ResponseStarted):
            return self.start()
        if isinstance(event, Usage):
            self._usage = event
            return []
        if isinstance(event, ToolCallDone):
            self._whole.add(event.index)
            if event.index == self._open_tool and self._held:
                return self._release()
            return []
        if isinstance(event, ResponseDone):
            self._all_whole = True
            out = self._release() if self._held else []
            self.ended = True
            out += self._close()
            usage = usage_fields(self._usage)
            if self._usage is None:
                usage["input_tokens"] = self._input_tokens
            reason = stop_reason(event.finish_reason)
            if event.stop_sequence is not None and reason == "end_turn":
                reason = "stop_sequence"
            delta = {"stop_reason": reason, "stop_sequence": event.stop_sequence}
            out.append({"type": "message_delta", "delta": delta, "usage": usage})
            out.append({"type": "message_stop"})
            return out
        if isinstance(event, ErrorEvent):
            self.ended = True
            self._held = []
            kind = "overloaded_error" if event.retryable else "api_error"
            return [{"type": "error", "error": {"type": kind, "message": event.message}}]
        if isinstance(event, ResponseCancelled | CompletionText | Embeddings):
            return []
        raise TypeError(f"unknown event {event!r}")


def _thinking_start() -> Json:
    """A thinking block's start (a fresh dict each time: the fold appends to it)."""
    return {"type": "thinking", "thinking": "", "signature": ""}


class MessageEncoder:
    """Events → SSE bytes for one streamed answer (``chat.Encoder``). A token of an open text
    or thinking block, almost every event of an answer, is written around one escaped string
    (the escaping ``json.dumps`` does), without building its event as a dict."""

    def __init__(self, builder: MessageBuilder) -> None:
        self._builder = builder
        self._heads: dict[tuple[str, int], bytes] = {}

    def _head(self, kind: str, index: int) -> bytes:
        head = self._heads.get((kind, index))
        if head is None:
            delta = '{"type":"content_block_delta","index":%d,"delta":{"type":"%s_delta","%s":'
            head = b"event: content_block_delta\ndata: " + (delta % (index, kind, kind)).encode()
            self._heads = {(kind, index): head}  # one open block at a time
        return head

    def encode(self, event: Event) -> bytes:
        builder = self._builder
        if type(event) is TextDelta or type(event) is ReasoningDelta:
            kind = "text" if type(event) is TextDelta else "thinking"
            if event.text and builder.open_block == kind and not builder.ended:
                head = self._head(kind, builder.open_index)
                return head + encode_basestring(event.text).encode() + _TAIL
        events = builder.feed(event)
        if not events:
            return b""
        if len(events) == 1:
            return sse(events[0])
        return b"".join(sse(e) for e in events)


_TAIL: Final = b"}}\n\n"


class MessageAccumulator:
    """Events → one ``message`` object (``chat.Accumulator``): the builder's events folded as
    the SDK folds a stream, the tool inputs parsed once each call is whole."""

    def __init__(self, builder: MessageBuilder) -> None:
        self._builder = builder
        self._message: Json | None = None
        self._json: dict[int, list[str]] = {}
        self._inputs: dict[str, Any] = {}  # tool call id → its parsed arguments
        self.finish_reason: str | None = None

    def add(self, event: Event) -> None:
        if isinstance(event, ToolCallDone):
            self._inputs[event.id] = event.arguments if event.arguments_valid else None
        elif isinstance(event, ResponseDone):
            self.finish_reason = event.finish_reason
        for item in self._builder.feed(event):
            self._fold(item)

    def _fold(self, event: Json) -> None:
        kind = event["type"]
        if kind == "message_start":
            self._message = event["message"]
            return
        message = self._message
        if message is None:
            return
        if kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                self._json.setdefault(event["index"], []).append(delta["partial_json"])
        elif kind == "message_delta":
            message.update(event["delta"])
            message["usage"] = event["usage"]

    def result(self) -> Json:
        message = self._message
        assert message is not None, "result() before the answer began"
        for index, parts in self._json.items():
            block = message["content"][index]
            parsed = self._inputs.get(block["id"])
            if parsed is None:
                try:
                    parsed = json.loads("".join(parts))
                except ValueError:
                    parsed = None
            block["input"] = parsed if isinstance(parsed, dict) else {}
        return message
