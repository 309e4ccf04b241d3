"""What a Responses WebSocket reads and says of its own (``socket_events.py``): client
messages parsed or refused, and the ``error`` and ``response.steer.failed`` events checked
against the openai SDK's strict types (``ResponsesServerEvent``)."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from openai.types.responses.responses_server_event import ResponsesServerEvent

from trio_gateway.core.errors import (
    ConnectionLimitReached,
    GatewayError,
    InvalidMessage,
    RateLimited,
    ResponseNotFound,
    TooManyRequests,
    UnknownMessageType,
    UpstreamUnreachable,
)
from trio_gateway.fronts.responses.socket_events import (
    CreateMessage,
    SteerMessage,
    error_event,
    parse_client_message,
    steer_failed_event,
)

SERVER_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponsesServerEvent)


def strict(event: dict[str, Any]) -> Any:
    """The event as the SDK's types read it, refusing anything they do not list."""
    return SERVER_EVENT.validate_python(event, strict=True)


def raw(message: object) -> bytes:
    return json.dumps(message).encode()


def test_a_create_is_its_body_and_its_lane() -> None:
    message = parse_client_message(
        raw({"type": "response.create", "stream_id": "s1", "model": "m", "input": "hi"})
    )
    assert isinstance(message, CreateMessage)
    assert message.stream_id == "s1"
    assert message.body == {"model": "m", "input": "hi"}
    assert message.generate is True
    assert message.depth_known


def test_generate_is_read_from_the_envelope_and_checked_with_the_body() -> None:
    message = parse_client_message(raw({"type": "response.create", "generate": "no"}))
    assert isinstance(message, CreateMessage) and message.generate == "no"
    assert "generate" not in message.body


@pytest.mark.parametrize(
    ("message", "error", "words"),
    [
        (b"{not json", InvalidMessage, "not JSON"),
        (b'{"a": "\xc3\x28"}', InvalidMessage, "UTF-8"),
        (b"[1, 2]", InvalidMessage, "JSON object"),
        (b'{"model": "m"}', InvalidMessage, "'type'"),
        (raw({"type": "response.cancel"}), UnknownMessageType, "response.create"),
        (raw({"type": "x" * 1000}), UnknownMessageType, "..."),
        (raw({"type": "response.create", "stream_id": ""}), InvalidMessage, "stream_id"),
        (raw({"type": "response.create", "stream_id": 3}), InvalidMessage, "stream_id"),
        (raw({"type": "response.create", "stream_id": "s" * 257}), InvalidMessage, "256"),
        (raw({"type": "response.steer", "input": "x"}), InvalidMessage, "previous_response"),
        (
            raw({"type": "response.steer", "previous_response_id": "r", "input": []}),
            InvalidMessage,
            "input",
        ),
        (
            raw({"type": "response.steer", "previous_response_id": "r", "input": "x", "a": 1}),
            InvalidMessage,
            "'a'",
        ),
        (b'{"type": "response.create", "n": NaN}', InvalidMessage, "not JSON"),
    ],
)
def test_refused_messages(message: bytes, error: type[GatewayError], words: str) -> None:
    with pytest.raises(error) as refused:
        parse_client_message(message)
    assert words in refused.value.message


def test_a_steer_keeps_its_input_as_sent() -> None:
    items = [{"type": "message", "role": "user", "content": "faster"}]
    message = parse_client_message(
        raw({"type": "response.steer", "previous_response_id": "resp_1", "input": items})
    )
    assert message == SteerMessage(previous_response_id="resp_1", input=items)


@pytest.mark.parametrize(
    ("error", "status", "code", "kind"),
    [
        (
            ResponseNotFound(
                "Previous response with id 'r' not found.", param="previous_response_id"
            ),
            400,
            "previous_response_not_found",
            "invalid_request_error",
        ),
        (
            ResponseNotFound("Response 'r' not found."),
            404,
            "response_not_found",
            "invalid_request_error",
        ),
        (TooManyRequests("8 lanes"), 429, "too_many_requests", "invalid_request_error"),
        (UpstreamUnreachable("down"), 502, "upstream_unreachable", "server_error"),
        (
            ConnectionLimitReached("60 minutes"),
            400,
            "websocket_connection_limit_reached",
            "invalid_request_error",
        ),
        (InvalidMessage("not JSON"), 400, "invalid_message", "invalid_request_error"),
    ],
)
def test_errors_have_the_websocket_shape(
    error: GatewayError, status: int, code: str, kind: str
) -> None:
    event = error_event(error, stream_id="lane", sequence_number=0)
    assert event["status"] == status
    assert event["error"]["code"] == code and event["error"]["type"] == kind
    assert event["error"]["message"] == error.message
    parsed = strict(event)
    assert parsed.type == "error" and parsed.stream_id == "lane" and parsed.sequence_number == 0
    # Not the HTTP stream's flat shape, which the SDK's WebSocket type refuses.
    with pytest.raises(pydantic.ValidationError):
        strict({"type": "error", "code": code, "message": "m", "sequence_number": 0})


def test_a_socket_error_names_no_lane() -> None:
    event = error_event(InvalidMessage("not JSON"))
    assert "stream_id" not in event and "sequence_number" not in event
    assert strict(event).status == 400


def test_a_rate_limit_carries_its_headers() -> None:
    limited = RateLimited(
        "slow down", retry_after_s=2.5, rate_headers=[(b"x-ratelimit-remaining-requests", b"0")]
    )
    event = error_event(limited)
    assert event["error"]["headers"] == {
        "retry-after": "3",
        "x-ratelimit-remaining-requests": "0",
    }
    assert strict(event).error.headers == event["error"]["headers"]


@pytest.mark.parametrize(
    "steer_input", ["be brief", [{"type": "message", "role": "user", "content": "be brief"}]]
)
def test_a_steer_fails_returning_its_input(steer_input: Any) -> None:
    steer = SteerMessage(previous_response_id="resp_1", input=steer_input)
    for stream_id in (None, "lane"):
        event = steer_failed_event(steer, stream_id=stream_id, sequence_number=7)
        parsed = strict(event)
        assert parsed.type == "response.steer.failed"
        assert parsed.error.code == "steering_not_supported"
        assert parsed.steer.previous_response_id == "resp_1"
        assert parsed.steer.id is None
        assert parsed.stream_id == stream_id and parsed.sequence_number == 7
        assert event["steer"]["input"] == steer_input
