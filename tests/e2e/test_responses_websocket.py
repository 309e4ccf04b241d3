"""The Responses WebSocket over real sockets, beyond what the SDK tests: the handshake (keys in
``Authorization`` or ``x-api-key``, refusals as JSON before the upgrade, ``max_sockets``
shared with ``/v1/ws``, a 404 for a path that takes no WebSocket), ``store: true`` writing the
stored record, a TCP connection dropped without a close frame, and turns of one conversation
kept on one vLLM replica."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import pytest
import trio
import trio_websocket
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage
from wsproto.frame_protocol import FrameProtocol

from tests.e2e.harness import (
    Stack,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from tests.e2e.responses_socket import strict
from tests.e2e.test_auth import keyed_stack
from tests.e2e.test_cancellation import LONG, wait_for_abort
from tests.e2e.test_replicas import finished, replicas_toml, two_sims

TIMEOUT_S = 20


def responses_url(stack: Stack, path: str = "/v1/responses") -> str:
    return stack.gateway.base_url.replace("http://", "ws://") + path


def create(content: str, **fields: Any) -> str:
    return json.dumps(
        {"type": "response.create", "model": "agent-lite", "input": content, **fields}
    )


async def until_done(ws: trio_websocket.WebSocketConnection) -> list[Any]:
    events = []
    while True:
        event = strict(await ws.get_message())
        events.append(event)
        if event.type in ("response.completed", "response.failed", "error"):
            return events


async def test_keys_at_the_handshake_and_refusals_as_json(tmp_path: Path) -> None:
    async with keyed_stack(tmp_path) as keyed:
        url = responses_url(keyed.stack)
        alice, bob = keyed.keys["alice"], keyed.keys["bob"]
        wrong: list[list[tuple[bytes, bytes]]] = [
            [],
            [(b"authorization", b"Bearer tgw-wrong")],
            [(b"x-api-key", b"nope")],
        ]
        for headers in wrong:
            with trio.fail_after(TIMEOUT_S), pytest.raises(trio_websocket.ConnectionRejected) as no:
                async with trio_websocket.open_websocket_url(url, extra_headers=headers):
                    pass
            assert no.value.status_code == 401
            assert no.value.body is not None
            assert json.loads(no.value.body)["error"]["code"] == "invalid_api_key"
            assert dict(no.value.headers or [])[b"content-type"] == b"application/json"
        with trio.fail_after(TIMEOUT_S):
            for headers in (
                [(b"x-api-key", alice.encode())],
                [(b"authorization", f"Bearer {alice}".encode())],
            ):
                async with trio_websocket.open_websocket_url(url, extra_headers=headers) as ws:
                    await ws.send_message(create(script({"text": "hello alice"})))
                    done = (await until_done(ws))[-1]
                    assert done.type == "response.completed"
                    assert done.response.output_text == "hello alice"
            # bob's key may not use this alias: refused on the create's lane, socket open.
            async with trio_websocket.open_websocket_url(
                url, extra_headers=[(b"x-api-key", bob.encode())]
            ) as ws:
                await ws.send_message(create("hi", stream_id="s"))
                error = (await until_done(ws))[-1]
                assert (error.type, error.status, error.stream_id) == ("error", 403, "s")
                assert error.error.code == "alias_not_allowed"
                await ws.send_message(
                    json.dumps(
                        {"type": "response.create", "model": "prompt-enhance", "input": "hi"}
                    )
                )
                assert (await until_done(ws))[-1].type == "response.completed"


async def test_max_sockets_counts_both_websocket_routes() -> None:
    async with running_sim() as sim:
        config = gateway_config(
            provider_toml("sim-a", sim.base_url), server="[websocket]\nmax_sockets = 2"
        )
        async with running_gateway(config) as gateway:
            stack = Stack(sim=sim, gateway=gateway)
            with trio.fail_after(TIMEOUT_S):
                async with (
                    trio_websocket.open_websocket_url(responses_url(stack, "/v1/ws")),
                    trio_websocket.open_websocket_url(responses_url(stack)) as open_one,
                ):
                    with pytest.raises(trio_websocket.ConnectionRejected) as full:
                        async with trio_websocket.open_websocket_url(responses_url(stack)):
                            pass
                    assert full.value.status_code == 503
                    assert full.value.body is not None
                    assert json.loads(full.value.body)["error"]["code"] == "overloaded"
                    assert dict(full.value.headers or [])[b"retry-after"] == b"1"
                    with pytest.raises(trio_websocket.ConnectionRejected) as ws_full:
                        async with trio_websocket.open_websocket_url(
                            responses_url(stack, "/v1/ws")
                        ):
                            pass
                    assert ws_full.value.status_code == 403
                    await open_one.send_message(create(script({"text": "still served"})))
                    assert (await until_done(open_one))[-1].response.output_text == "still served"
                assert gateway.app.websocket.places.open == 0
                async with trio_websocket.open_websocket_url(responses_url(stack)):
                    pass


async def test_a_path_that_takes_no_websocket_is_a_404_naming_those_that_do(stack: Stack) -> None:
    with trio.fail_after(TIMEOUT_S), pytest.raises(trio_websocket.ConnectionRejected) as no:
        async with trio_websocket.open_websocket_url(responses_url(stack, "/v1/chat/completions")):
            pass
    assert no.value.status_code == 404
    assert no.value.body is not None
    error = json.loads(no.value.body)["error"]
    assert error["code"] == "not_found"
    assert "GET /v1/ws" in error["message"] and "GET /v1/responses" in error["message"]


async def test_store_true_keeps_the_response_as_http_does(stack: Stack) -> None:
    async with trio_websocket.open_websocket_url(responses_url(stack)) as ws:
        with trio.fail_after(TIMEOUT_S):
            await ws.send_message(create(script({"text": "kept"})))
            kept = (await until_done(ws))[-1].response
            await ws.send_message(create(script({"text": "not kept"}), store=False))
            gone = (await until_done(ws))[-1].response
    assert (kept.model_extra or {})["store"] is True
    assert (gone.model_extra or {})["store"] is False
    async with httpx.AsyncClient() as client:
        found = await client.get(f"{stack.v1}/responses/{kept.id}")
        assert (
            found.status_code == 200 and found.json()["output"][0]["content"][0]["text"] == "kept"
        )
        missing = await client.get(f"{stack.v1}/responses/{gone.id}")
        assert missing.status_code == 404
        # And over HTTP, a turn may continue the stored one.
        more = await client.post(
            f"{stack.v1}/responses",
            json={"model": "agent-lite", "previous_response_id": kept.id, "input": "and then"},
        )
        assert more.status_code == 200, more.text


async def test_a_connection_dropped_without_a_close_frame_aborts_the_upstream(
    stack: Stack,
) -> None:
    """As Codex leaves: its TCP connection closed, no close frame first."""
    host, port = stack.gateway.base_url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    ws = WSConnection(ConnectionType.CLIENT)
    with trio.fail_after(TIMEOUT_S):
        await stream.send_all(ws.send(Request(host=host, target="/v1/responses")))
        deltas = 0
        accepted = False
        while deltas < 3:
            ws.receive_data(await stream.receive_some())
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    accepted = True
                    await stream.send_all(ws.send(TextMessage(data=create(LONG, store=False))))
                elif isinstance(event, TextMessage) and "output_text.delta" in event.data:
                    deltas += 1
        assert accepted
        await stream.aclose()
    await wait_for_abort(stack.sim)


async def test_http2_extended_connect_carries_the_mode(stack: Stack) -> None:
    """RFC 8441 over h2c: a CONNECT with ``:protocol websocket`` to ``/v1/responses`` (hypercorn
    announces SETTINGS_ENABLE_CONNECT_PROTOCOL), then WebSocket frames in DATA frames."""
    host, port = stack.gateway.base_url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    h2c.initiate_connection()
    await stream.send_all(h2c.data_to_send())
    frames = FrameProtocol(client=True, extensions=[])
    stream_id: int | None = None
    status = None
    texts: list[str] = []
    with trio.fail_after(TIMEOUT_S):
        while not any('"response.completed"' in text for text in texts):
            data = await stream.receive_some()
            assert data, "the gateway closed the connection"
            for event in h2c.receive_data(data):
                if isinstance(event, h2.events.RemoteSettingsChanged) and stream_id is None:
                    stream_id = h2c.get_next_available_stream_id()
                    headers = [
                        (":method", "CONNECT"),
                        (":protocol", "websocket"),
                        (":scheme", "http"),
                        (":path", "/v1/responses"),
                        (":authority", f"{host}:{port}"),
                        ("sec-websocket-version", "13"),
                    ]
                    h2c.send_headers(stream_id, headers)
                elif isinstance(event, h2.events.ResponseReceived):
                    assert stream_id is not None
                    status = dict(event.headers)[b":status"]
                    message = create(script({"text": "over h2"}))
                    h2c.send_data(stream_id, bytes(frames.send_data(message, fin=True)))
                elif isinstance(event, h2.events.DataReceived):
                    h2c.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    frames.receive_bytes(event.data)
                    texts += [str(frame.payload) for frame in frames.received_frames()]
            await stream.send_all(h2c.data_to_send())
    await stream.aclose()
    assert status == b"200"
    done = strict(texts[-1])
    assert done.type == "response.completed" and done.response.output_text == "over h2"


async def test_every_turn_of_a_conversation_goes_to_one_replica() -> None:
    async with two_sims() as (a, b):
        config = gateway_config(replicas_toml(a.base_url, b.base_url, routing="affinity"))
        async with running_gateway(config) as gateway:
            stack = Stack(sim=a, gateway=gateway)
            homes: list[set[int]] = []
            async with trio_websocket.open_websocket_url(responses_url(stack)) as ws:
                with trio.fail_after(TIMEOUT_S):
                    # Which replica a conversation's hash lands on depends on the replicas'
                    # names, which hold this run's ports: six all on one happens in 1 run of
                    # 32. Conversations go on (up to 32) until both replicas have had one.
                    for conversation in range(32):
                        if conversation >= 6 and {h for served in homes for h in served} == {0, 1}:
                            break
                        served: set[int] = set()
                        previous = None
                        for turn in range(3):
                            before = (finished(a), finished(b))
                            fields: dict[str, Any] = {"store": False}
                            if previous is not None:
                                fields["previous_response_id"] = previous
                            content = f"conversation {conversation} turn {turn}"
                            await ws.send_message(create(content, **fields))
                            previous = (await until_done(ws))[-1].response.id
                            served.add(0 if finished(a) > before[0] else 1)
                        homes.append(served)
            # Each conversation stayed on one replica, and they did not all land on one.
            assert all(len(served) == 1 for served in homes), homes
            assert {home for served in homes for home in served} == {0, 1}


async def test_a_client_that_stops_reading_is_dropped_and_its_upstream_aborted() -> None:
    async with running_sim() as sim:
        config = gateway_config(
            provider_toml("sim-a", sim.base_url), server="client_stall_timeout_s = 1.0"
        )
        async with running_gateway(config) as gateway:
            host, port = gateway.base_url.removeprefix("http://").rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            ws = WSConnection(ConnectionType.CLIENT)
            with trio.fail_after(TIMEOUT_S):
                await stream.send_all(ws.send(Request(host=host, target="/v1/responses")))
                while not any(isinstance(e, AcceptConnection) for e in ws.events()):
                    ws.receive_data(await stream.receive_some())
                await stream.send_all(ws.send(TextMessage(data=create(LONG, store=False))))
                # Reads nothing more: the gateway's writes wait, then it gives up on the client.
                await wait_for_abort(sim, timeout_s=TIMEOUT_S)
            await wait_until(
                lambda: (
                    gateway.router.metrics.registry.get_sample_value(
                        "gateway_cancellations_total", {"cause": "client_stall"}
                    )
                    == 1.0
                )
            )
            await stream.aclose()
