"""The Responses API's WebSocket mode, message by message: what a client sends, read, and the
socket's own server events (its ``error`` and ``response.steer.failed``). Pure.

The client sends JSON text: ``response.create`` (a ``POST /v1/responses`` body with ``type``,
and ``stream_id`` for its lane, ``generate: false`` to remember a response without an answer)
and ``response.steer``. The ``response.*`` events of an answer are ``events.py``'s, with
``stream_id`` added when the create had one.

The WebSocket's ``error`` is not the HTTP stream's flat one: ``{"type": "error", "status": N,
"error": {"type", "code", "message", "param"}}``, with ``stream_id`` and ``sequence_number``
when it answers a create (the openai SDK's ``ResponseWsError``). A continuation that finds no
response is the API's ``previous_response_not_found``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

from trio_gateway.core.body import loads
from trio_gateway.core.errors import (
    GatewayError,
    InvalidMessage,
    KeyLimitError,
    ResponseNotFound,
    UnknownMessageType,
)
from trio_gateway.core.validation import within_depth
from trio_gateway.fronts.responses.request import RESPONSES_PARTS

CREATE: Final = "response.create"
STEER: Final = "response.steer"
KNOWN_TYPES: Final = (CREATE, STEER)
# A lane's name is the client's; a bound keeps it from being a way to hold memory.
MAX_STREAM_ID_CHARS: Final = 256
# The envelope's own fields: the rest of a create is the POST body.
ENVELOPE: Final = ("type", "stream_id", "generate")
STEER_FIELDS: Final = frozenset({"type", "previous_response_id", "input"})
NOT_FOUND_CODE: Final = "previous_response_not_found"
# A steer's failure: the gateway does not steer (docs/api.md).
STEERING_NOT_SUPPORTED: Final = "steering_not_supported"


@attrs.frozen(kw_only=True)
class CreateMessage:
    """A ``response.create``: its lane, its body (the POST body: no envelope fields),
    whether to generate, and its size in bytes."""

    stream_id: str | None
    body: dict[str, Any]
    generate: object  # True unless the client said otherwise; checked with the body
    size: int
    depth_known: bool  # within_depth of its text: the body need not be walked for depth


@attrs.frozen(kw_only=True)
class SteerMessage:
    """A ``response.steer``: the response it names, and its input as sent (its failure
    returns it)."""

    previous_response_id: str
    input: str | list[Any]


ClientMessage = CreateMessage | SteerMessage


def parse_client_message(raw: bytes) -> ClientMessage:
    """One client message, or a :class:`MessageRefused` (the socket stays open). A create's
    body is checked later, as a request's (its errors are its lane's)."""
    try:
        # A create's input and its parts bounded as a POST body's are.
        message = loads(raw, RESPONSES_PARTS)
    except GatewayError as exc:
        raise InvalidMessage(exc.message) from None
    except UnicodeDecodeError:
        raise InvalidMessage("the message is not UTF-8") from None
    except ValueError as exc:
        raise InvalidMessage(f"the message is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise InvalidMessage("a message must be a JSON object")
    kind = message.get("type")
    if not isinstance(kind, str):
        raise InvalidMessage("'type' must be a string: 'response.create' or 'response.steer'")
    if kind == CREATE:
        return _create(message, raw)
    if kind == STEER:
        return _steer(message)
    shown = kind if len(kind) <= 64 else kind[:64] + "..."
    raise UnknownMessageType(
        f"unknown message type {shown!r}; this socket takes {', '.join(KNOWN_TYPES)}"
    )


def _create(message: dict[str, Any], raw: bytes) -> CreateMessage:
    stream_id = message.get("stream_id")
    if stream_id is not None and (
        not isinstance(stream_id, str) or not 1 <= len(stream_id) <= MAX_STREAM_ID_CHARS
    ):
        raise InvalidMessage(
            f"'stream_id' must be a string of 1 to {MAX_STREAM_ID_CHARS} characters"
        )
    body = {k: v for k, v in message.items() if k not in ENVELOPE}
    generate = message.get("generate")
    return CreateMessage(
        stream_id=stream_id,
        body=body,
        generate=True if generate is None else generate,
        size=len(raw),
        depth_known=within_depth(raw),
    )


def _steer(message: dict[str, Any]) -> SteerMessage:
    previous = message.get("previous_response_id")
    steer_input = message.get("input")
    if not isinstance(previous, str) or not previous:
        raise InvalidMessage("'previous_response_id' must name the response to steer")
    if extra := set(message) - STEER_FIELDS:
        raise InvalidMessage(
            f"a steer takes only type, previous_response_id and input, not {min(extra)!r}"
        )
    if not isinstance(steer_input, str | list) or not steer_input:
        raise InvalidMessage("'input' must be a non-empty string or array of input items")
    return SteerMessage(previous_response_id=previous, input=steer_input)


def error_event(
    error: GatewayError,
    *,
    stream_id: str | None = None,
    sequence_number: int | None = None,
) -> dict[str, Any]:
    """The socket's ``error`` for ``error``: for a create (its lane's ``stream_id``, and the
    ``sequence_number`` of its stream), or for the socket (neither)."""
    code, status, kind = error.code, error.status, error.openai_type
    if isinstance(error, ResponseNotFound) and error.param == "previous_response_id":
        # The API's word for a continuation it cannot find (a client starts over on it).
        code, status, kind = NOT_FOUND_CODE, 400, "invalid_request_error"
    body: dict[str, Any] = {
        "type": kind,
        "code": code,
        "message": error.message,
        "param": error.param,
    }
    headers = _headers(error)
    if headers:
        body["headers"] = headers
    event: dict[str, Any] = {"type": "error", "status": status, "error": body}
    if stream_id is not None:
        event["stream_id"] = stream_id
    if sequence_number is not None:
        event["sequence_number"] = sequence_number
    return event


def _headers(error: GatewayError) -> dict[str, str]:
    """The headers an HTTP answer would have carried (``retry-after``, a key's
    ``x-ratelimit-*``): a client waits on them as it would over HTTP."""
    pairs = error.headers() if isinstance(error, KeyLimitError) or error.retry_after_s else []
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in pairs}


def steer_failed_event(
    steer: SteerMessage,
    *,
    stream_id: str | None,
    sequence_number: int,
) -> dict[str, Any]:
    """``response.steer.failed``, returning the steer's input so the client can carry it into
    its next ``response.create``: the gateway does not steer a running answer."""
    message = (
        "the gateway does not steer a response; send this input in the next response.create "
        "on the lane"
    )
    event: dict[str, Any] = {
        "type": "response.steer.failed",
        "sequence_number": sequence_number,
        "error": {
            "type": "invalid_request_error",
            "code": STEERING_NOT_SUPPORTED,
            "message": message,
        },
        "steer": {"previous_response_id": steer.previous_response_id, "input": steer.input},
    }
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(event: Mapping[str, Any]) -> str:
    """An event as the text of one WebSocket message."""
    return _ENCODER.encode(event)
