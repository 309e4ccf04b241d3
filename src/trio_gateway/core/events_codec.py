"""The gateway's own event vocabulary on the wire (version 1), and the WebSocket message codec.

Pure: internal :mod:`trio_gateway.core.events` (or a :class:`GatewayError`) + request id + sequence
number → one JSON object; a client's WebSocket message → a typed message or a typed refusal. The
SSE front and the WebSocket front only move what this module produces; ``docs/events.md`` is the
contract.

Every event is one object::

    {"v": 1, "type": "text.delta", "id": "r1", "request_id": "9f3c...", "seq": 4, "text": "Hel"}

``id`` (the client's own name for the request) is present on the WebSocket only. ``seq`` counts a
request's events from 0, so a consumer can tell that nothing was lost or reordered.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from trio_gateway.core.errors import (
    GatewayError,
    InvalidMessage,
    MessageRefused,
    MessageTooLarge,
    UnknownMessageType,
)
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
from trio_gateway.core.request import strict_loads
from trio_gateway.core.sse import encode_event

VERSION = 1
MAX_ID_CHARS = 128

# Close codes the gateway sends on /v1/ws besides the standard ones (docs/events.md).
CLOSE_GOING_AWAY = 1001  # the gateway is shutting down
CLOSE_SLOW_CONSUMER = 4001
CLOSE_KEEPALIVE_TIMEOUT = 4002

# Each request ends with exactly one of these.
TERMINAL_TYPES = frozenset({"response.done", "response.cancelled", "error"})

PING: dict[str, Any] = {"v": VERSION, "type": "ping"}
PONG: dict[str, Any] = {"v": VERSION, "type": "pong"}


def dumps(obj: Any) -> str:
    """Compact JSON text with UTF-8 left as is: a text frame or an SSE ``data:`` line (JSON
    text never holds a raw CR or LF)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse_frame(event: dict[str, Any]) -> bytes:
    """One event as SSE: the ``event:`` name is the event's ``type``."""
    return encode_event(dumps(event).encode(), event=event["type"])


def is_terminal(item: Event | GatewayError) -> bool:
    return isinstance(item, GatewayError | ResponseDone | ResponseCancelled | ErrorEvent)


def error_fields(error: GatewayError) -> dict[str, Any]:
    return {
        "code": error.code,
        "message": error.message,
        "retryable": error.retryable,
        "retry_after_s": error.retry_after_s,
        "provider": error.provider,
        "param": error.param,
    }


def event_fields(event: Event, *, alias: str | None) -> tuple[str, dict[str, Any]]:
    """The wire ``type`` and payload of one internal event."""
    if isinstance(event, TextDelta):
        return "text.delta", {"text": event.text}
    if isinstance(event, ReasoningDelta):
        return "reasoning.delta", {"text": event.text}
    if isinstance(event, ReasoningDetail):
        # The entry an OpenAI-shaped answer carries in reasoning_details (docs/api.md).
        return "reasoning.detail", {"detail": detail_object(event)}
    if isinstance(event, ToolCallDelta):
        # "id" is the envelope's (the client's request name): the tool call's own id is call_id.
        return "tool_call.delta", {
            "index": event.index,
            "call_id": event.id,
            "name": event.name,
            "arguments_delta": event.arguments,
        }
    if isinstance(event, ToolCallDone):
        return "tool_call.done", {
            "index": event.index,
            "call_id": event.id,
            "name": event.name,
            # Parsed JSON when valid; else the raw string the model wrote, flagged.
            "arguments": event.arguments if event.arguments_valid else event.arguments_raw,
            "arguments_valid": event.arguments_valid,
        }
    if isinstance(event, ResponseStarted):
        return "response.started", {"alias": alias, "provider": event.provider}
    if isinstance(event, Usage):
        return "usage", {
            "prompt_tokens": event.prompt_tokens,
            "completion_tokens": event.completion_tokens,
            "reasoning_tokens": event.reasoning_tokens,
            "cached_tokens": event.cached_tokens,
        }
    if isinstance(event, ResponseDone):
        return "response.done", {"finish_reason": event.finish_reason}
    if isinstance(event, ResponseCancelled):
        return "response.cancelled", {"reason": event.reason}
    if isinstance(event, ErrorEvent):
        return "error", {
            "code": event.code,
            "message": event.message,
            "retryable": event.retryable,
            "retry_after_s": event.retry_after_s,
            "provider": event.provider,
            "param": None,
        }
    raise TypeError(f"unknown event {event!r}")


class EventEncoder:
    """One request's events → wire objects, numbered from 0."""

    def __init__(self, *, request_id: str | None, alias: str | None, id: str | None = None) -> None:
        self._alias = alias
        self._request_id = request_id
        self._id = id
        self._seq = 0

    def encode(self, item: Event | GatewayError) -> dict[str, Any]:
        if isinstance(item, GatewayError):
            kind, fields = "error", error_fields(item)
        else:
            kind, fields = event_fields(item, alias=self._alias)
        out: dict[str, Any] = {"v": VERSION, "type": kind}
        if self._id is not None:
            out["id"] = self._id
        out["request_id"] = self._request_id
        out["seq"] = self._seq
        self._seq += 1
        out.update(fields)
        return out


# --- WebSocket: what a client may send -------------------------------------------------------


@attrs.frozen(kw_only=True)
class RequestMessage:
    id: str
    body: dict[str, Any]


@attrs.frozen(kw_only=True)
class CancelMessage:
    id: str


@attrs.frozen(kw_only=True)
class PingMessage:
    pass


@attrs.frozen(kw_only=True)
class PongMessage:
    pass


ClientMessage = RequestMessage | CancelMessage | PingMessage | PongMessage

_KEYS = {
    "request": frozenset({"v", "type", "id", "body"}),
    "cancel": frozenset({"v", "type", "id"}),
    "ping": frozenset({"v", "type"}),
    "pong": frozenset({"v", "type"}),
}
# An oversized message is not parsed (that is what the limit is for), but its id is worth naming:
# the head of {"type": "request", "id": "...", ...}, the order every client in docs/ writes.
_HEAD_ID = re.compile(
    r'^\s*\{\s*"type"\s*:\s*"(?:request|cancel)"\s*,\s*"id"\s*:\s*"([^"\\]{1,128})"'
)


def _head_id(data: str | bytes) -> str | None:
    """The id a message that cannot be read names in its head, if it is written first."""
    head = data[:256] if isinstance(data, str) else data[:256].decode("utf-8", "replace")
    match = _HEAD_ID.match(head)
    return match.group(1) if match else None


def _valid_id(value: object) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS:
        return value
    return None


def refusal(error: MessageRefused) -> dict[str, Any]:
    """The ``error`` event for a refused message: no request ran, so ``request_id`` is null."""
    return {
        "v": VERSION,
        "type": "error",
        "id": error.message_id,  # null when no id could be read: still a WebSocket event
        "request_id": None,
        "seq": 0,
        **error_fields(error),
    }


def parse_client_message(data: str | bytes, *, max_bytes: int) -> ClientMessage:
    """Parse one WebSocket message from a client, or raise a :class:`MessageRefused`."""
    # surrogatepass: a str is measured, never refused here (the reader refuses a lone one).
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > max_bytes:
        raise MessageTooLarge(
            f"message of {size} bytes is over the limit of {max_bytes} bytes",
            message_id=_head_id(data),
        )
    try:
        obj = strict_loads(data)
    except UnicodeDecodeError:
        raise InvalidMessage("message is not UTF-8", message_id=_head_id(data)) from None
    except ValueError as exc:
        # Where in the message, as an HTTP body's refusal says it (core/body.py).
        raise InvalidMessage(f"message is not JSON: {exc}", message_id=_head_id(data)) from None
    if not isinstance(obj, dict):
        raise InvalidMessage("message must be a JSON object")
    raw_id = obj.get("id")
    message_id = _valid_id(raw_id)
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise InvalidMessage("'type' must be a string", message_id=message_id)
    if kind not in _KEYS:
        raise UnknownMessageType(
            f"unknown message type {kind!r} (known: {', '.join(_KEYS)})", message_id=message_id
        )
    version = obj.get("v", VERSION)
    if type(version) is not int or version != VERSION:
        raise InvalidMessage(
            f"unsupported version {version!r}; this gateway speaks v{VERSION}",
            message_id=message_id,
        )
    extra = set(obj) - _KEYS[kind]
    if extra:
        raise InvalidMessage(
            f"unknown key{'s' if len(extra) > 1 else ''} in a {kind!r} message: "
            + ", ".join(repr(k) for k in sorted(extra)),
            message_id=message_id,
        )
    if kind == "ping":
        return PingMessage()
    if kind == "pong":
        return PongMessage()
    if message_id is None:
        raise InvalidMessage(
            f"'id' must be a string of 1 to {MAX_ID_CHARS} characters; got {raw_id!r}"
        )
    if kind == "cancel":
        return CancelMessage(id=message_id)
    body = obj.get("body")
    if not isinstance(body, dict):
        raise InvalidMessage(
            "'body' must be an object (a chat completion request)", message_id=message_id
        )
    return RequestMessage(id=message_id, body=body)
