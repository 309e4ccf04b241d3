"""What an operator and a client see of WebSocket requests: each request's access line under
its own request id, a client's cancel told apart from a client that vanished, and a refused
handshake as the Python client's own error."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket

from tests.e2e.harness import Stack, script, wait_until
from tests.e2e.test_auth import keyed_stack
from tests.e2e.test_cancellation import LONG, wait_for_abort
from tests.e2e.test_ws import Transcript, request, send, ws_stack, ws_url
from trio_gateway.client import HandshakeRejected, TextDelta, connect
from trio_gateway.ops.access import RequestIdFilter

TIMEOUT_S = 10


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The access records as the gateway's log handler gets them: its filter adds the
    ``[request id]`` of the line's prefix (ops/log_queue.py installs the same one)."""
    caplog.set_level(logging.INFO, "trio_gateway.access")
    caplog.handler.addFilter(RequestIdFilter())
    return caplog


def ws_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict[str, Any]]]:
    """(the id in the line's prefix, the line's fields) of each WebSocket access line."""
    return [
        (r.__dict__["request_id"], dict(r.__dict__["access"]))
        for r in caplog.records
        if r.name == "trio_gateway.access" and r.__dict__["access"]["route"] == "WS /v1/ws"
    ]


async def test_each_websocket_request_is_logged_under_its_own_id_with_how_it_ended(
    stack: Stack, access: pytest.LogCaptureFixture
) -> None:
    transcript = Transcript()
    with trio.fail_after(TIMEOUT_S):
        async with trio_websocket.open_websocket_url(ws_url(stack)) as ws:
            await send(ws, request("done", script({"text": "hello"})))
            await send(ws, request("unknown", "hi", model="no-such-alias"))
            await send(ws, request("cancelled", LONG))
            await send(ws, request("cut", LONG))
            await transcript.read_until(
                ws,
                lambda: (
                    transcript.ended("done")
                    and transcript.ended("unknown")
                    and "text.delta" in transcript.types("cancelled")
                    and "text.delta" in transcript.types("cut")
                ),
            )
            await send(ws, {"type": "cancel", "id": "cancelled"})
            await transcript.read_until(ws, lambda: transcript.ended("cancelled"))
        # Leaving the block closed the socket: "cut" was cancelled by the client vanishing.
    await wait_for_abort(stack.sim, aborts=2)
    await wait_until(lambda: len(ws_lines(access)) == 4)
    by_id = {fields["request_id"]: (prefix, fields) for prefix, fields in ws_lines(access)}
    ended = {}
    for id in ("done", "unknown", "cancelled", "cut"):
        [request_id] = {e["request_id"] for e in transcript.by_id[id]}
        prefix, fields = by_id[request_id]
        assert prefix == request_id, id  # the line's [request id] is the one its events carry
        ended[id] = (fields["outcome"], fields["code"])
    assert ended == {
        "done": ("completed", None),
        "unknown": ("refused", "model_not_found"),
        "cancelled": ("cancelled", "ws_cancel"),
        "cut": ("cancelled", "client_gone"),
    }
    assert transcript.by_id["cancelled"][-1]["reason"] == "ws_cancel"


async def test_a_stream_left_just_before_leaving_connect_is_logged_as_a_cancel(
    stack: Stack, access: pytest.LogCaptureFixture
) -> None:
    """The client's cancel goes out before its socket closes: the gateway sees a cancel
    (ws_cancel), not a client that vanished (client_gone)."""
    with trio.fail_after(TIMEOUT_S):
        async with connect(ws_url(stack)) as gw:
            seen = 0
            async for event in gw.stream("agent-lite", [{"role": "user", "content": LONG}]):
                seen += isinstance(event, TextDelta)
                if seen == 3:
                    request_id = event.request_id
                    break  # then straight out of connect()
    await wait_for_abort(stack.sim)
    await wait_until(lambda: len(ws_lines(access)) == 1)
    [(prefix, line)] = ws_lines(access)
    assert prefix == line["request_id"] == request_id
    assert (line["outcome"], line["code"]) == ("cancelled", "ws_cancel")


async def test_a_refused_handshake_is_the_clients_own_error_with_the_gateways_code(
    tmp_path: Path,
) -> None:
    async with keyed_stack(tmp_path) as keyed:
        url = keyed.ws_url()
        with trio.fail_after(TIMEOUT_S):
            for key in (None, "tgw-not-a-key"):
                with pytest.raises(HandshakeRejected) as rejected:
                    async with connect(url, api_key=key):
                        pass
                assert (rejected.value.status_code, rejected.value.code) == (401, "invalid_api_key")
                assert "key" in rejected.value.message.lower()
                assert isinstance(rejected.value.__cause__, trio_websocket.ConnectionRejected)
            async with connect(url, api_key=keyed.keys["alice"]) as gw:
                events = [
                    e async for e in gw.stream("agent-lite", [{"role": "user", "content": "hi"}])
                ]
            assert type(events[-1]).__name__ == "ResponseDone"


async def test_a_gateway_at_max_sockets_refuses_with_a_403_the_client_names() -> None:
    async with ws_stack(server="[websocket]\nmax_sockets = 1") as stack:
        with trio.fail_after(TIMEOUT_S):
            async with connect(ws_url(stack)):
                with pytest.raises(HandshakeRejected) as rejected:
                    async with connect(ws_url(stack)):
                        pass
    assert rejected.value.status_code == 403
    assert rejected.value.code is None
    assert "403" in rejected.value.message
