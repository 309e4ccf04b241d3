"""``GET /v1/ws`` over real sockets: trio-websocket against the gateway and the simulator."""

from __future__ import annotations

import json
import socket
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio_websocket

from tests.e2e.harness import (
    FAST_SIM,
    Stack,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from tests.e2e.test_cancellation import LONG, wait_for_abort
from trio_gateway.core.events_codec import TERMINAL_TYPES
from trio_gateway.sim import SimConfig

TIMEOUT_S = 10


def ws_url(stack: Stack) -> str:
    return stack.gateway.base_url.replace("http://", "ws://") + "/v1/ws"


def request(id: str, content: str, **fields: Any) -> dict[str, Any]:
    return {"type": "request", "id": id, "body": chat(content, **fields)}


async def send(ws: trio_websocket.WebSocketConnection, message: dict[str, Any]) -> None:
    await ws.send_message(json.dumps(message))


async def receive(ws: trio_websocket.WebSocketConnection) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(await ws.get_message())
    return message


class Transcript:
    """Events received on one socket, by the client's request id."""

    def __init__(self) -> None:
        self.by_id: dict[str | None, list[dict[str, Any]]] = defaultdict(list)

    def add(self, event: dict[str, Any]) -> None:
        self.by_id[event.get("id")].append(event)

    def types(self, id: str) -> list[str]:
        return [e["type"] for e in self.by_id[id]]

    def text(self, id: str) -> str:
        return "".join(e["text"] for e in self.by_id[id] if e["type"] == "text.delta")

    def ended(self, id: str) -> bool:
        return bool(self.by_id[id]) and self.by_id[id][-1]["type"] in TERMINAL_TYPES

    async def read_until(self, ws: trio_websocket.WebSocketConnection, done: Any) -> None:
        while not done():
            self.add(await receive(ws))


def cancellations(stack: Stack, cause: str) -> float:
    """Requests cancelled for ``cause``, as the gateway's metrics count them."""
    value = stack.gateway.router.metrics.registry.get_sample_value(
        "gateway_cancellations_total", {"cause": cause}
    )
    return float(value or 0.0)


@asynccontextmanager
async def ws_stack(
    server: str = "", sim: SimConfig = FAST_SIM, *, kernel_stall_drop: bool = True
) -> AsyncIterator[Stack]:
    """A stack with its own [server] / [websocket] settings."""
    async with running_sim(sim) as handle:
        config = gateway_config(provider_toml("sim-a", handle.base_url), server=server)
        async with running_gateway(config, kernel_stall_drop=kernel_stall_drop) as gateway:
            yield Stack(sim=handle, gateway=gateway)


async def test_two_requests_share_a_socket_and_one_is_cancelled_alone(stack: Stack) -> None:
    words = "alpha beta gamma delta"
    more = " epsilon zeta eta theta"
    steady = script({"text": words}, {"delay_s": 0.3}, {"text": more})
    transcript = Transcript()
    with trio.fail_after(TIMEOUT_S):
        async with trio_websocket.open_websocket_url(ws_url(stack)) as ws:
            await send(ws, request("long", LONG))
            await send(ws, request("steady", steady))
            await transcript.read_until(
                ws,
                lambda: (
                    transcript.types("long").count("text.delta") >= 3
                    and "text.delta" in transcript.types("steady")
                ),
            )
            await send(ws, {"type": "cancel", "id": "long"})
            await transcript.read_until(
                ws, lambda: transcript.ended("long") and transcript.ended("steady")
            )
            # A cancel that crosses the end changes nothing and draws no reply.
            await send(ws, {"type": "cancel", "id": "long"})
            await send(ws, {"type": "ping"})
            assert await receive(ws) == {"v": 1, "type": "pong"}
    long, steady_events = transcript.by_id["long"], transcript.by_id["steady"]
    assert long[-1]["type"] == "response.cancelled"
    assert long[-1]["reason"] == "ws_cancel"
    assert steady_events[-1]["type"] == "response.done"
    assert steady_events[-1]["finish_reason"] == "stop"
    assert transcript.text("steady") == words + more
    assert transcript.types("steady")[0] == "response.started"
    assert transcript.types("steady")[-2] == "usage"
    for events in (long, steady_events):
        assert [e["seq"] for e in events] == list(range(len(events)))
        assert len({e["request_id"] for e in events}) == 1
    assert long[0]["request_id"] != steady_events[0]["request_id"]
    # The simulator saw the cancelled one abort and the other finish.
    await wait_for_abort(stack.sim)
    stats = stack.sim.engine.stats()
    assert stats.aborts == 1
    assert stats.finished == 1
    assert stats.tokens_generated < 1000
    await wait_until(lambda: cancellations(stack, "ws_cancel") == 1)
    assert cancellations(stack, "client_gone") == 0


async def test_a_cancel_followed_at_once_by_a_close_counts_as_a_cancel(stack: Stack) -> None:
    transcript = Transcript()
    with trio.fail_after(TIMEOUT_S):
        async with trio_websocket.open_websocket_url(ws_url(stack)) as ws:
            await send(ws, request("long", LONG))
            await send(ws, request("other", LONG))
            await transcript.read_until(
                ws,
                lambda: (
                    "text.delta" in transcript.types("long")
                    and "text.delta" in transcript.types("other")
                ),
            )
            # The close frame follows the cancel in the same breath: the client asked for the
            # cancel, so that is what it is, not a disconnect. The other request was cut by
            # the close: that one is a disconnect.
            await send(ws, {"type": "cancel", "id": "long"})
    await wait_for_abort(stack.sim, aborts=2)
    await wait_until(
        lambda: cancellations(stack, "ws_cancel") + cancellations(stack, "client_gone") == 2
    )
    assert cancellations(stack, "ws_cancel") == 1
    assert cancellations(stack, "client_gone") == 1


async def test_closing_the_socket_aborts_every_upstream_on_it(stack: Stack) -> None:
    ids = ["a", "b", "c"]
    transcript = Transcript()
    front = stack.gateway.app.websocket
    with trio.fail_after(TIMEOUT_S):
        async with trio_websocket.open_websocket_url(ws_url(stack)) as ws:
            for id in ids:
                await send(ws, request(id, LONG))
            await transcript.read_until(
                ws, lambda: all("text.delta" in transcript.types(id) for id in ids)
            )
            assert front.statistics().requests_in_flight == 3
            assert front.statistics().open_sockets == 1
    await wait_for_abort(stack.sim, aborts=3)
    await wait_until(lambda: cancellations(stack, "client_gone") == 3)
    assert stack.sim.engine.stats().tokens_generated < 3000
    upstream = stack.gateway.router.upstreams["sim-a"]
    await wait_until(lambda: upstream.statistics().in_flight == 0, timeout_s=2)
    await wait_until(
        lambda: front.statistics().open_sockets == 0 and front.statistics().requests_in_flight == 0,
        timeout_s=2,
    )


async def test_malformed_messages_get_an_error_and_the_socket_stays_open() -> None:
    limits = "[websocket]\nmax_message_bytes = 2000\nmax_requests_per_socket = 2"
    async with ws_stack(server=limits) as stack:
        with trio.fail_after(TIMEOUT_S):
            async with trio_websocket.open_websocket_url(ws_url(stack)) as ws:
                transcript = Transcript()

                async def refused(message: str | dict[str, Any]) -> dict[str, Any]:
                    """The error the message drew; other requests' events meanwhile are kept."""
                    text = message if isinstance(message, str) else json.dumps(message)
                    await ws.send_message(text)
                    while True:
                        reply = await receive(ws)
                        if reply["type"] == "error" and reply["seq"] == 0:
                            return reply
                        transcript.add(reply)

                reply = await refused("this is not json")
                assert (reply["code"], reply["id"], reply["request_id"]) == (
                    "invalid_message",
                    None,
                    None,
                )
                reply = await refused({"type": "subscribe", "id": "x1"})
                assert (reply["code"], reply["id"]) == ("unknown_type", "x1")
                reply = await refused({"type": "request", "id": "x2", "body": ["not", "a", "dict"]})
                assert (reply["code"], reply["id"]) == ("invalid_message", "x2")
                reply = await refused(request("x3", "p" * 3000))
                assert (reply["code"], reply["id"]) == ("message_too_large", "x3")
                # A well-formed message whose body is not a valid request: that request's error.
                reply = await refused({"type": "request", "id": "x4", "body": {"model": "m"}})
                assert (reply["code"], reply["id"]) == ("invalid_request", "x4")
                assert reply["request_id"] is not None
                reply = await refused({**request("x5", "hi"), "body": chat("hi", model="nope")})
                assert (reply["code"], reply["id"]) == ("model_not_found", "x5")

                await send(ws, request("r1", LONG))
                await send(ws, request("r2", LONG))
                reply = await refused(request("r3", "hi"))
                assert (reply["code"], reply["id"], reply["retryable"]) == (
                    "too_many_requests",
                    "r3",
                    True,
                )
                # Refusing a duplicate leaves the running request with that id alone.
                reply = await refused(request("r1", "hi"))
                assert (reply["code"], reply["id"], reply["request_id"]) == (
                    "duplicate_id",
                    "r1",
                    None,
                )
                for id in ("r1", "r2"):
                    await send(ws, {"type": "cancel", "id": id})
                await transcript.read_until(
                    ws,
                    lambda: (
                        transcript.types("r1")[-1:] == ["response.cancelled"]
                        and transcript.ended("r2")
                    ),
                )
                assert transcript.types("r2")[-1] == "response.cancelled"
                # Still open and serving.
                await send(ws, request("ok", script({"text": "still here"})))
                await transcript.read_until(ws, lambda: transcript.ended("ok"))
                assert transcript.text("ok") == "still here"
                assert transcript.types("ok")[-1] == "response.done"
        await wait_for_abort(stack.sim, aborts=2)


async def test_a_socket_that_stops_reading_is_closed_4001_and_its_upstreams_freed() -> None:
    fast = attrs.evolve(FAST_SIM, decode_step_s=0.0002, decode_step_s_per_seq=0.0)
    # The stall deadline only bounds the kernel's drop of the connection; the queue bound acts
    # long before, and leaves time to read the close frame.
    settings = "client_stall_timeout_s = 10.0\n[websocket]\nmax_queued_events = 16"
    async with ws_stack(server=settings, sim=fast) as stack, trio.open_nursery() as nursery:
        host, port = stack.gateway.base_url.removeprefix("http://").split(":")
        sock = trio.socket.socket()
        # A tiny receive window: the gateway's writes block almost at once.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect((host, int(port)))
        ws = await trio_websocket.wrap_client_stream(
            nursery, trio.SocketStream(sock), host, "/v1/ws", message_queue_size=1
        )
        await send(ws, request("flood", script({"text_tokens": 200000})))
        await send(ws, request("other", LONG))
        # Never read. The queue bound must cancel both long before 200k tokens.
        await wait_for_abort(stack.sim, aborts=2, timeout_s=20)
        assert stack.sim.engine.stats().tokens_generated < 100000
        assert stack.gateway.router.upstreams["sim-a"].statistics().in_flight == 0
        await wait_until(lambda: cancellations(stack, "client_stall") == 2)
        # Reading again drains what was already on its way, then the close frame.
        with trio.fail_after(TIMEOUT_S), pytest.raises(trio_websocket.ConnectionClosed) as closed:
            while True:
                await ws.get_message()
        assert closed.value.reason is not None
        assert closed.value.reason.code == 4001
        assert "slow consumer" in (closed.value.reason.reason or "")
        await wait_until(lambda: stack.gateway.app.websocket.statistics().open_sockets == 0)
        nursery.cancel_scope.cancel()


async def close_on_cancel(sock: trio.socket.SocketType) -> None:
    try:
        await trio.sleep_forever()
    finally:
        sock.close()


async def test_a_socket_whose_close_frame_cannot_be_written_is_dropped() -> None:
    """A client that never reads again, on a platform without TCP_USER_TIMEOUT: the 4001 close
    frame blocks the writer for good, and only the gateway's write watchdog ends the socket."""
    fast = attrs.evolve(FAST_SIM, decode_step_s=0.0002, decode_step_s_per_seq=0.0)
    settings = "client_stall_timeout_s = 0.5\n[websocket]\nmax_queued_events = 16"
    async with (
        ws_stack(server=settings, sim=fast, kernel_stall_drop=False) as stack,
        trio.open_nursery() as nursery,
    ):
        host, port = stack.gateway.base_url.removeprefix("http://").split(":")
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect((host, int(port)))
        # Closed on the way out whatever happens: a regression must fail, not hang on the
        # handler blocked writing to this socket.
        nursery.start_soon(close_on_cancel, sock)
        ws = await trio_websocket.wrap_client_stream(
            nursery, trio.SocketStream(sock), host, "/v1/ws", message_queue_size=1
        )
        await send(ws, request("flood", script({"text_tokens": 200000})))
        await wait_for_abort(stack.sim, aborts=1, timeout_s=20)
        await wait_until(lambda: cancellations(stack, "client_stall") == 1)
        # Never read: the socket's handler still ends, and the connection is gone.
        await wait_until(
            lambda: stack.gateway.app.websocket.statistics().open_sockets == 0, timeout_s=10
        )
        # Closed by the connection's task, which ends right after the handler (hypercorn's
        # own close first): polled, not asserted at the instant the handler count reached 0.
        await wait_until(lambda: len(stack.gateway.app.connections) == 0)
        nursery.cancel_scope.cancel()


async def test_a_socket_that_never_answers_pings_is_closed_4002() -> None:
    settings = "[websocket]\nping_interval_s = 0.1\nping_timeout_s = 0.2"
    async with ws_stack(server=settings) as stack:
        with trio.fail_after(TIMEOUT_S):
            async with trio_websocket.open_websocket_url(ws_url(stack)) as ws:
                await send(ws, request("r1", LONG))
                pings = 0
                with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                    while True:
                        message = await receive(ws)
                        pings += message["type"] == "ping"
        assert closed.value.reason is not None
        assert closed.value.reason.code == 4002
        assert pings == 1
        await wait_for_abort(stack.sim)
        await wait_until(lambda: cancellations(stack, "client_gone") == 1)


async def test_a_socket_that_answers_pings_stays_open() -> None:
    settings = "[websocket]\nping_interval_s = 0.05\nping_timeout_s = 0.3"
    async with ws_stack(server=settings) as stack:
        with trio.fail_after(TIMEOUT_S):
            async with trio_websocket.open_websocket_url(ws_url(stack)) as ws:
                pings = 0
                while pings < 10:
                    assert await receive(ws) == {"v": 1, "type": "ping"}
                    await send(ws, {"type": "pong"})
                    pings += 1
                # Ten intervals later, past several ping timeouts, still serving.
                transcript = Transcript()
                await send(ws, request("r1", script({"text": "still here"})))
                while not transcript.ended("r1"):
                    message = await receive(ws)
                    if message["type"] == "ping":
                        await send(ws, {"type": "pong"})
                    else:
                        transcript.add(message)
                assert transcript.text("r1") == "still here"


async def test_other_websocket_paths_are_refused(stack: Stack) -> None:
    url = stack.gateway.base_url.replace("http://", "ws://") + "/v1/elsewhere"
    with trio.fail_after(TIMEOUT_S), pytest.raises(trio_websocket.ConnectionRejected) as rejected:
        async with trio_websocket.open_websocket_url(url):
            pass
    assert rejected.value.status_code == 404
    assert rejected.value.body is not None
    assert "GET /v1/ws" in json.loads(rejected.value.body)["error"]["message"]


async def test_a_draining_gateway_refuses_new_requests_then_closes_the_socket_with_1001(
    stack: Stack,
) -> None:
    transcript = Transcript()
    async with trio_websocket.open_websocket_url(ws_url(stack)) as ws:
        with trio.fail_after(TIMEOUT_S):
            await send(ws, request("long", LONG, stream=True))
            await transcript.read_until(ws, lambda: "text.delta" in transcript.types("long"))
            stack.gateway.router.drain.begin()
            await send(ws, request("late", "hi"))
            await transcript.read_until(ws, lambda: transcript.ended("late"))
            assert transcript.by_id["late"][-1]["type"] == "error"
            assert transcript.by_id["late"][-1]["code"] == "shutting_down"
            assert not transcript.ended("long")  # still answering within the drain
            stack.gateway.router.drain.cancel_all()  # the drain's deadline
            await transcript.read_until(ws, lambda: transcript.ended("long"))
            assert transcript.by_id["long"][-1]["code"] == "shutting_down"
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                while True:
                    transcript.add(await receive(ws))
    assert closed.value.reason is not None and closed.value.reason.code == 1001
    await wait_for_abort(stack.sim)


async def test_concurrent_handshakes_never_pass_max_sockets() -> None:
    """20 handshakes at once against max_sockets = 2: the check and the count must be one step,
    or several handshakes pass the check while the first accepts are still in flight."""
    async with ws_stack(server="[websocket]\nmax_sockets = 2") as stack:
        url = ws_url(stack)
        accepted = 0
        rejected: list[int] = []
        all_tried = trio.Event()
        tried = 0

        async def connect() -> None:
            nonlocal accepted, tried
            try:
                async with trio_websocket.open_websocket_url(url):
                    accepted += 1
                    tried += 1
                    if tried == 20:
                        all_tried.set()
                    # Hold the socket until every handshake has had its answer.
                    await all_tried.wait()
            except trio_websocket.ConnectionRejected as exc:
                rejected.append(exc.status_code)
                tried += 1
                if tried == 20:
                    all_tried.set()

        with trio.fail_after(TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(connect)
        assert accepted == 2
        assert rejected == [403] * 18
        await wait_until(lambda: stack.gateway.app.websocket.statistics().open_sockets == 0)


async def test_sockets_past_max_sockets_are_refused_at_the_handshake() -> None:
    async with ws_stack(server="[websocket]\nmax_sockets = 2") as stack:
        url = ws_url(stack)
        async with (
            trio_websocket.open_websocket_url(url) as first,
            trio_websocket.open_websocket_url(url),
        ):
            with (
                trio.fail_after(TIMEOUT_S),
                pytest.raises(trio_websocket.ConnectionRejected) as rejected,
            ):
                async with trio_websocket.open_websocket_url(url):
                    pass
            assert rejected.value.status_code == 403
            # The sockets already open still work.
            await send(first, request("r1", script({"text": "still here"})))
            transcript = Transcript()
            with trio.fail_after(TIMEOUT_S):
                await transcript.read_until(first, lambda: transcript.ended("r1"))
            assert transcript.text("r1") == "still here"
        # Closed sockets free their places.
        await wait_until(lambda: stack.gateway.app.websocket.statistics().open_sockets == 0)
        async with trio_websocket.open_websocket_url(url):
            pass
