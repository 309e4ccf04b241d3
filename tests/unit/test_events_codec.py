"""The event vocabulary's encoders and the WebSocket message codec, by tables."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_gateway import client
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import ConfigError, WebSocketConfig
from trio_gateway.core.errors import (
    AllProvidersFailed,
    GatewayError,
    InvalidRequest,
    MessageRefused,
    Overloaded,
    UpstreamRateLimited,
    UpstreamServerError,
)
from trio_gateway.core.events import (
    ENDPOINT_ONLY_EVENTS,
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
from trio_gateway.core.events_codec import (
    TERMINAL_TYPES,
    CancelMessage,
    EventEncoder,
    PingMessage,
    PongMessage,
    RequestMessage,
    dumps,
    event_fields,
    is_terminal,
    parse_client_message,
    refusal,
    sse_frame,
)
from trio_gateway.core.sse import SSEDecoder

# (internal event, its wire type, its wire payload)
EVENT_TABLE: list[tuple[Event, str, dict[str, Any]]] = [
    (ResponseStarted("vllm-a"), "response.started", {"alias": "agent-lite", "provider": "vllm-a"}),
    (ReasoningDelta("hmm"), "reasoning.delta", {"text": "hmm"}),
    (
        ReasoningDetail(0, "anthropic-claude-v1", text="hmm", signature="c2ln"),
        "reasoning.detail",
        {
            "detail": {
                "type": "reasoning.text",
                "text": "hmm",
                "signature": "c2ln",
                "format": "anthropic-claude-v1",
                "index": 0,
            }
        },
    ),
    (TextDelta("Hello 世界\u2028"), "text.delta", {"text": "Hello 世界\u2028"}),
    (
        ToolCallDelta(0, "call-1", "get_weather", ""),
        "tool_call.delta",
        {"index": 0, "call_id": "call-1", "name": "get_weather", "arguments_delta": ""},
    ),
    (
        ToolCallDelta(1, None, None, '{"ci'),
        "tool_call.delta",
        {"index": 1, "call_id": None, "name": None, "arguments_delta": '{"ci'},
    ),
    (
        ToolCallDone(0, "call-1", "get_weather", {"city": "Paris"}, '{"city": "Paris"}', True),
        "tool_call.done",
        {
            "index": 0,
            "call_id": "call-1",
            "name": "get_weather",
            "arguments": {"city": "Paris"},
            "arguments_valid": True,
        },
    ),
    (
        ToolCallDone(1, "call-2", "f", '{"city": "Par', '{"city": "Par', False),
        "tool_call.done",
        {
            "index": 1,
            "call_id": "call-2",
            "name": "f",
            "arguments": '{"city": "Par',
            "arguments_valid": False,
        },
    ),
    (
        Usage(10, 5, 2, None),
        "usage",
        {"prompt_tokens": 10, "completion_tokens": 5, "reasoning_tokens": 2, "cached_tokens": None},
    ),
    (ResponseDone("tool_calls"), "response.done", {"finish_reason": "tool_calls"}),
    (ResponseCancelled("ws_cancel"), "response.cancelled", {"reason": "ws_cancel"}),
    (
        ErrorEvent("upstream_error", "boom", True, 2.0, "vllm-a"),
        "error",
        {
            "code": "upstream_error",
            "message": "boom",
            "retryable": True,
            "retry_after_s": 2.0,
            "provider": "vllm-a",
            "param": None,
        },
    ),
]


@pytest.mark.parametrize(("event", "kind", "payload"), EVENT_TABLE)
def test_each_event_has_its_wire_form(event: Event, kind: str, payload: dict[str, Any]) -> None:
    encoder = EventEncoder(request_id="req-1", alias="agent-lite")
    assert encoder.encode(event) == {
        "v": 1,
        "type": kind,
        "request_id": "req-1",
        "seq": 0,
        **payload,
    }
    assert is_terminal(event) == (kind in TERMINAL_TYPES)


def test_every_internal_event_type_is_in_the_table() -> None:
    covered = {type(event) for event, _, _ in EVENT_TABLE}
    assert covered == set(Event.__args__) - set(ENDPOINT_ONLY_EVENTS)


def test_the_answers_of_completions_and_embeddings_have_no_wire_form() -> None:
    for event in (CompletionText(0, "a"), Embeddings(([1.0],))):
        with pytest.raises(TypeError):
            event_fields(event, alias=None)


def test_unknown_events_are_refused() -> None:
    with pytest.raises(TypeError):
        event_fields("text", alias=None)  # type: ignore[arg-type]


ERROR_TABLE: list[tuple[GatewayError, dict[str, Any]]] = [
    (
        InvalidRequest("'messages' must be a non-empty list", param="messages"),
        {
            "code": "invalid_request",
            "message": "'messages' must be a non-empty list",
            "retryable": False,
            "retry_after_s": None,
            "provider": None,
            "param": "messages",
        },
    ),
    (
        UpstreamRateLimited("slow down", provider="vllm-a", retry_after_s=3.0),
        {
            "code": "rate_limited",
            "message": "slow down",
            "retryable": True,
            "retry_after_s": 3.0,
            "provider": "vllm-a",
            "param": None,
        },
    ),
    (
        Overloaded("busy", retry_after_s=1.0),
        {
            "code": "overloaded",
            "message": "busy",
            "retryable": True,
            "retry_after_s": 1.0,
            "provider": None,
            "param": None,
        },
    ),
]


@pytest.mark.parametrize(("error", "payload"), ERROR_TABLE)
def test_gateway_errors_become_error_events(error: GatewayError, payload: dict[str, Any]) -> None:
    encoded = EventEncoder(request_id="req-1", alias=None, id="r7").encode(error)
    assert encoded == {
        "v": 1,
        "type": "error",
        "id": "r7",
        "request_id": "req-1",
        "seq": 0,
        **payload,
    }
    assert is_terminal(error)


def test_all_providers_failed_keeps_the_shortest_wait() -> None:
    error = AllProvidersFailed(
        [
            UpstreamServerError("a down", provider="a"),
            UpstreamRateLimited("b busy", provider="b", retry_after_s=4.0),
        ]
    )
    encoded = EventEncoder(request_id="q", alias=None).encode(error)
    assert encoded["code"] == "upstream_unavailable"
    assert encoded["retryable"] is True
    assert encoded["retry_after_s"] == 4.0


def test_sequence_numbers_count_one_request_from_zero() -> None:
    encoder = EventEncoder(request_id="q", alias="agent-lite", id="r1")
    events = [encoder.encode(event) for event, _, _ in EVENT_TABLE]
    assert [e["seq"] for e in events] == list(range(len(EVENT_TABLE)))
    assert all(e["id"] == "r1" and e["request_id"] == "q" and e["v"] == 1 for e in events)
    # A second request starts over.
    assert EventEncoder(request_id="q2", alias=None).encode(TextDelta("x"))["seq"] == 0


def test_envelope_fields_come_first() -> None:
    encoded = EventEncoder(request_id="q", alias=None, id="r1").encode(TextDelta("x"))
    assert list(encoded)[:5] == ["v", "type", "id", "request_id", "seq"]


def test_sse_frames_name_the_event_and_decode_back() -> None:
    event = EventEncoder(request_id="q", alias=None).encode(TextDelta("a\nb \u2028 ü"))
    frame = sse_frame(event)
    assert frame.startswith(b"event: text.delta\ndata: {")
    assert frame.endswith(b"}\n\n")
    [decoded] = SSEDecoder().feed(frame)
    assert decoded.event == "text.delta"
    assert json.loads(decoded.data) == event


# --- What a client sends ---------------------------------------------------------------------

BODY = {"model": "agent-lite", "messages": [{"role": "user", "content": "hi"}]}

VALID_MESSAGES: list[tuple[str | bytes, object]] = [
    (
        json.dumps({"type": "request", "id": "r1", "body": BODY}),
        RequestMessage(id="r1", body=BODY),
    ),
    (
        json.dumps({"v": 1, "type": "request", "id": "x" * 128, "body": BODY}).encode(),
        RequestMessage(id="x" * 128, body=BODY),
    ),
    ('{"type":"cancel","id":"r1"}', CancelMessage(id="r1")),
    ('{"type":"ping"}', PingMessage()),
    ('{"type":"pong","v":1}', PongMessage()),
]


@pytest.mark.parametrize(("data", "expected"), VALID_MESSAGES)
def test_valid_messages_parse(data: str | bytes, expected: object) -> None:
    assert parse_client_message(data, max_bytes=10_000) == expected


# (message, the refusal's code, the id it names)
REFUSALS: list[tuple[str | bytes, str, str | None]] = [
    ("", "invalid_message", None),
    ("not json", "invalid_message", None),
    (b"\xff\xfe", "invalid_message", None),
    ("[1, 2]", "invalid_message", None),
    ('{"id": "r1"}', "invalid_message", "r1"),
    ('{"type": 3, "id": "r1"}', "invalid_message", "r1"),
    ('{"type": "nope", "id": "r1"}', "unknown_type", "r1"),
    ('{"type": "nope"}', "unknown_type", None),
    ('{"type": "request", "body": {}}', "invalid_message", None),
    ('{"type": "request", "id": "", "body": {}}', "invalid_message", None),
    ('{"type": "request", "id": 5, "body": {}}', "invalid_message", None),
    ('{"type": "request", "id": "' + "x" * 129 + '", "body": {}}', "invalid_message", None),
    ('{"type": "request", "id": "r1"}', "invalid_message", "r1"),
    ('{"type": "request", "id": "r1", "body": [1]}', "invalid_message", "r1"),
    ('{"type": "request", "id": "r1", "body": {}, "bodyy": {}}', "invalid_message", "r1"),
    ('{"type": "cancel", "id": "r1", "reason": "x"}', "invalid_message", "r1"),
    ('{"type": "cancel"}', "invalid_message", None),
    ('{"v": 2, "type": "cancel", "id": "r1"}', "invalid_message", "r1"),
    ('{"v": true, "type": "cancel", "id": "r1"}', "invalid_message", "r1"),
    # Not JSON as every front reads it (core/body.py), yet the head names the request.
    ('{"type": "request", "id": "r1", "body": {"x": "\\ud800"}}', "invalid_message", "r1"),
    ('{"type": "request", "id": "r1", "body": {"t": -1e400}}', "invalid_message", "r1"),
    (b'{"type": "request", "id": "r1", "body": {"x": "\xed\xa0\x80"}}', "invalid_message", "r1"),
    ('{"type": "request", "id": "r1", "body": {"x": "\ud800"}}', "invalid_message", "r1"),
    (
        '{"type": "request", "id": "r9", "body": {"pad": "' + "x" * 300 + '"}}',
        "message_too_large",
        "r9",
    ),
    ('{"type":"cancel","id":"r9","pad":"' + "é" * 150 + '"}', "message_too_large", "r9"),
    (
        '{"body": {"pad": "' + "x" * 300 + '"}, "type": "request", "id": "r9"}',
        "message_too_large",
        None,
    ),
]


@pytest.mark.parametrize(("data", "code", "message_id"), REFUSALS)
def test_malformed_messages_are_refused_naming_their_id(
    data: str | bytes, code: str, message_id: str | None
) -> None:
    with pytest.raises(MessageRefused) as caught:
        parse_client_message(data, max_bytes=300)
    assert caught.value.code == code
    assert caught.value.message_id == message_id
    event = refusal(caught.value)
    assert event["type"] == "error"
    assert event["code"] == code
    assert event["id"] == message_id
    assert event["request_id"] is None
    assert event["retryable"] is False


def test_the_size_limit_counts_utf8_bytes() -> None:
    message = json.dumps({"type": "cancel", "id": "é" * 20}, ensure_ascii=False)
    assert len(message) < 60 < len(message.encode())
    with pytest.raises(MessageRefused):
        parse_client_message(message, max_bytes=60)
    assert parse_client_message(message, max_bytes=len(message.encode())) == CancelMessage(
        id="é" * 20
    )


@given(st.one_of(st.text(), st.binary()))
def test_any_input_parses_or_raises_the_one_refusal(data: str | bytes) -> None:
    with contextlib.suppress(MessageRefused):
        parse_client_message(data, max_bytes=1000)


# --- The client's typed events are the same vocabulary ----------------------------------------


@pytest.mark.parametrize(("event", "kind", "payload"), EVENT_TABLE)
def test_the_client_decodes_every_event(event: Event, kind: str, payload: dict[str, Any]) -> None:
    wire = json.loads(
        dumps(EventEncoder(request_id="q", alias="agent-lite", id="r1").encode(event))
    )
    decoded = client.decode_event(wire)
    assert decoded is not None
    assert type(decoded).__name__ == (type(event).__name__ if kind != "error" else "Error")
    assert (decoded.id, decoded.request_id, decoded.seq) == ("r1", "q", 0)
    for name, value in payload.items():
        assert getattr(decoded, name) == value


def test_the_client_skips_unknown_types_and_refuses_other_versions() -> None:
    assert client.decode_event({"v": 1, "type": "response.progress", "id": "r1"}) is None
    with pytest.raises(client.ProtocolError):
        client.decode_event({"v": 2, "type": "text.delta"})
    with pytest.raises(client.ProtocolError):
        client.decode_event({"v": 1, "type": "text.delta", "id": "r1", "seq": 0})


# --- The [websocket] table -------------------------------------------------------------------

ALIAS = """
[[aliases.agent-lite.providers]]
name = "a"
type = "openai_compatible"
base_url = "http://127.0.0.1:8000/v1"
model = "m"
"""


def test_websocket_limits_have_defaults_and_are_validated() -> None:
    defaults = parse_config(ALIAS, environ={}).websocket
    assert defaults == WebSocketConfig()
    assert defaults.max_queued_events >= 1 and defaults.ping_timeout_s > 0
    tuned = parse_config("[websocket]\nmax_queued_events = 8\nping_interval_s = 5\n" + ALIAS)
    assert (tuned.websocket.max_queued_events, tuned.websocket.ping_interval_s) == (8, 5.0)
    bad = (
        "[websocket]\nmax_message_bytes = 0\nmax_requests_per_socket = 0\n"
        'max_queued_events = "8"\nping_interval_s = 0\nping_timeout_s = -1\nmax_socket = 3\n'
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(bad + ALIAS, environ={})
    assert any("websocket.max_queued_events" in p for p in caught.value.problems)
    assert any("websocket" in p and "max_socket" in p for p in caught.value.problems)
    with pytest.raises(ConfigError) as caught:
        parse_config(bad.replace('"8"', "8").replace("max_socket = 3\n", "") + ALIAS)
    assert sorted(caught.value.problems) == [
        "websocket.max_message_bytes: must be at least 1",
        "websocket.max_requests_per_socket: must be at least 1",
        "websocket.ping_interval_s: must be greater than 0",
        "websocket.ping_timeout_s: must be greater than 0",
    ]


@pytest.mark.parametrize(
    "data",
    [
        '{"type": "request", "id": "r1", "body": {"temperature": NaN}}',
        '{"type": "request", "id": "r1", "body": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"type": "request", "id": "r1", "body": {"temperature": 1e400}}',
    ],
)
def test_non_json_numbers_and_deep_nesting_are_refused_not_crashes(data: str) -> None:
    with pytest.raises(MessageRefused, match=r"not JSON: .* at line 1 column "):
        parse_client_message(data, max_bytes=1_000_000)
