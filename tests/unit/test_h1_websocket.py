"""The WebSocket connections the HTTP/1.1 server serves itself (``http1/websocket.py``), on a
socket pair with wsproto as the client: the handshake and its refusals, frames both ways (one
write for many messages), pings, the close both ways, a message past the limit, compression
when offered, and writes that wait for a client that does not read."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel
import trio.testing
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.extensions import PerMessageDeflate

from trio_gateway.http1.request import RequestParser, find_head_end
from trio_gateway.http1.websocket import (
    SEND_MANY,
    WebSocketConnection,
    is_websocket_upgrade,
    text_frame,
)

Message = MutableMapping[str, Any]
App = Callable[[Message, Any, Any], Awaitable[None]]


@attrs.define
class Peer:
    """The client's end: wsproto over the other half of the socket pair."""

    stream: trio.SocketStream
    ws: WSConnection
    events: list[Any] = attrs.field(factory=list)

    async def send(self, event: Any) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def next(self) -> Any:
        """The next event, a message whole (wsproto gives a message in the pieces read)."""
        parts: list[str] = []
        while True:
            while not self.events:
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                self.ws.receive_data(data)
                self.events += list(self.ws.events())
            event = self.events.pop(0)
            if not isinstance(event, TextMessage):
                return event
            parts.append(event.data)
            if event.message_finished:
                return TextMessage(data="".join(parts))


def upgrade(extensions: list[Any] | None = None, **headers: str) -> bytes:
    request = Request(
        host="gw", target="/v1/responses", extensions=extensions or [], extra_headers=[]
    )
    client = WSConnection(ConnectionType.CLIENT)
    raw = client.send(request)
    for name, value in headers.items():
        raw = raw.replace(b"\r\n\r\n", f"\r\n{name}: {value}\r\n\r\n".encode(), 1)
    return raw


@asynccontextmanager
async def served(
    app: App, raw_head: bytes | None = None, *, extensions: list[Any] | None = None
) -> AsyncIterator[Peer]:
    a, b = socket.socketpair()
    server, client = (
        trio.SocketStream(trio.socket.from_stdlib_socket(a)),
        trio.SocketStream(trio.socket.from_stdlib_socket(b)),
    )
    ws = WSConnection(ConnectionType.CLIENT)
    request = ws.send(Request(host="gw", target="/v1/responses", extensions=extensions or []))
    raw = raw_head if raw_head is not None else request
    end = find_head_end(raw)
    assert end is not None
    head = RequestParser(max_body_bytes=1000).head(raw[:end])
    assert is_websocket_upgrade(head)
    connection = WebSocketConnection(
        server,
        head,
        raw[end:],
        app,
        client=("127.0.0.1", 1),
        local=("127.0.0.1", 2),
        date=lambda: b"today",
        max_message_chars=1000,
    )

    async def serve() -> None:
        # As the server does: the connection is closed once its handler returns.
        try:
            await connection.serve()
        finally:
            await trio.aclose_forcefully(server)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        yield Peer(client, ws)
        nursery.cancel_scope.cancel()


async def echo(scope: Message, receive: Any, send: Any) -> None:
    """Accepts, then answers each text with its two halves as two messages (one write)."""
    assert (await receive())["type"] == "websocket.connect"
    assert SEND_MANY in scope["extensions"]
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            echo.codes.append(message["code"])  # type: ignore[attr-defined]
            return
        text = message["text"]
        if text == "close":
            await send({"type": "websocket.close", "code": 4000, "reason": "asked"})
            continue
        half = len(text) // 2
        await send({"type": "websocket.send", "texts": [text[:half], text[half:]]})


echo.codes = []  # type: ignore[attr-defined]


async def test_frames_both_ways_and_the_close_asked_by_the_app() -> None:
    echo.codes.clear()  # type: ignore[attr-defined]
    with trio.fail_after(5):
        async with served(echo) as peer:
            accepted = await peer.next()
            assert isinstance(accepted, AcceptConnection)
            await peer.send(TextMessage(data="héllo wörld"))
            first, second = await peer.next(), await peer.next()
            assert (first.data, second.data) == ("héllo", " wörld")
            await peer.send(Ping(payload=b"p"))
            pong = await peer.next()
            assert isinstance(pong, Pong) and pong.payload == b"p"
            await peer.send(TextMessage(data="close"))
            closed = await peer.next()
            assert isinstance(closed, CloseConnection) and closed.code == 4000
            await peer.send(closed.response())
            while await peer.next() is not None:
                pass
    assert echo.codes == [4000]  # type: ignore[attr-defined]


async def test_the_client_closing_is_answered_and_told_to_the_app() -> None:
    echo.codes.clear()  # type: ignore[attr-defined]
    with trio.fail_after(5):
        async with served(echo) as peer:
            assert isinstance(await peer.next(), AcceptConnection)
            await peer.send(CloseConnection(code=1000, reason="bye"))
            reply = await peer.next()
            assert isinstance(reply, CloseConnection) and reply.code == 1000
            while await peer.next() is not None:
                pass
    assert echo.codes == [1000]  # type: ignore[attr-defined]


async def test_a_message_past_the_limit_closes_with_1009() -> None:
    echo.codes.clear()  # type: ignore[attr-defined]
    with trio.fail_after(5):
        async with served(echo) as peer:
            assert isinstance(await peer.next(), AcceptConnection)
            await peer.send(TextMessage(data="x" * 600, message_finished=False))
            await peer.send(TextMessage(data="x" * 600))
            closed = await peer.next()
            assert isinstance(closed, CloseConnection) and closed.code == 1009
    assert echo.codes == [1009]  # type: ignore[attr-defined]


async def test_compression_is_used_when_offered() -> None:
    with trio.fail_after(5):
        async with served(echo, extensions=[PerMessageDeflate()]) as peer:
            accepted = await peer.next()
            assert isinstance(accepted, AcceptConnection)
            assert [type(e) for e in accepted.extensions] == [PerMessageDeflate]
            await peer.send(TextMessage(data="abcdefgh" * 50))
            first, second = await peer.next(), await peer.next()
            assert first.data + second.data == "abcdefgh" * 50


async def test_a_handshake_that_is_not_one_is_a_400() -> None:
    raw = upgrade().replace(b"Sec-WebSocket-Version: 13", b"Sec-WebSocket-Version: 8")
    with trio.fail_after(5):
        async with served(echo, raw) as peer:
            response = await peer.stream.receive_some(65536)
    assert response.startswith(b"HTTP/1.1 400 ")
    assert b"version 13" in response


@pytest.mark.parametrize("deny", ["close", "response"])
async def test_an_app_may_refuse_before_the_upgrade(deny: str) -> None:
    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        if deny == "close":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
        await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": b"{}"})
        assert (await receive())["type"] == "websocket.disconnect"

    with trio.fail_after(5):
        async with served(app) as peer:
            refused = await peer.next()
            assert isinstance(refused, RejectConnection)
            assert refused.status_code == (403 if deny == "close" else 401)
            if deny == "response":
                body = await peer.next()
                assert isinstance(body, RejectData) and body.data == b"{}"


async def test_writes_wait_in_order_for_a_client_that_does_not_read() -> None:
    """A write the kernel cannot take whole waits for room; the writes after it wait for it,
    so frames never interleave; the client reading again gets every message, in order."""
    many = [f"{i:04d}" + "y" * 4000 for i in range(200)]
    done = trio.Event()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})

        async def writer(part: list[str]) -> None:
            for text in part:
                await send({"type": "websocket.send", "text": text})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer, many[:100])
            await trio.lowlevel.checkpoint()
            nursery.start_soon(writer, many[100:])
        done.set()
        await receive()

    with trio.fail_after(10):
        async with served(app) as peer:
            assert isinstance(await peer.next(), AcceptConnection)
            # The kernel's buffers are full: both writers wait for room.
            await trio.testing.wait_all_tasks_blocked()
            assert not done.is_set()
            got: list[str] = []
            while len(got) < len(many):
                event = await peer.next()
                assert isinstance(event, TextMessage)
                got.append(event.data)
            await done.wait()
    assert sorted(got) == many
    assert [g for g in got if g < "0100"] == many[:100]


def test_text_frames_are_what_wsproto_writes() -> None:
    from wsproto.connection import Connection

    server = Connection(ConnectionType.SERVER)
    for size in (0, 1, 125, 126, 65535, 65536):
        text = "é" * size
        assert text_frame(text) == server.send(TextMessage(data=text))
