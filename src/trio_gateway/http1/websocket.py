"""WebSocket connections the gateway's HTTP/1.1 server serves itself, on wsproto's frames: an
upgrade to a path the server was told to keep (``/v1/responses``). The rest (``/v1/ws``, and
WebSocket over HTTP/2) goes to hypercorn's.

Why not hypercorn's: an answer on the Responses API's socket is some 80 messages a turn, one
event each, and hypercorn writes every message through its own path (the ASGI send, the frame,
a lock, a socket write): 2.5x the gateway's CPU per turn of the same answer over SSE, whose
events of one upstream read go out in one write. Here an app may hand over several messages at
once (ASGI ``websocket.send`` with ``texts``, offered as the scope extension
:data:`SEND_MANY`): their frames go out in one write. Writes are cancellable (a deadline of the
app's own, not a watchdog), and reading goes on while a write waits, so a client's close frame
or hang-up is seen even while it does not read.

::

    connection task: the app (scope, receive, send)
    └── reader (from the accept): frames → receive(); pings answered; the close answered

The ASGI side is hypercorn's: ``websocket.connect`` first, ``websocket.accept``, or a denial
(``websocket.http.response.*``, or ``websocket.close`` before the accept: 403), then
``websocket.receive`` / ``websocket.send`` / ``websocket.close``, and ``websocket.disconnect``
with the client's close code (1006 when the connection just ended). A message past
``max_message_chars`` closes the socket with 1009.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final
from urllib.parse import unquote

import trio
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Event, Message, Ping, TextMessage
from wsproto.extensions import Extension, PerMessageDeflate
from wsproto.frame_protocol import CloseReason
from wsproto.handshake import WEBSOCKET_VERSION, server_extensions_handshake
from wsproto.utilities import LocalProtocolError, generate_accept_token, split_comma_header

from trio_gateway.http1.heads import encode_response_head, error_response
from trio_gateway.http1.request import RequestHead

log = logging.getLogger("trio_gateway")

ASGIMessage = MutableMapping[str, Any]
App = Callable[
    [ASGIMessage, Callable[[], Awaitable[ASGIMessage]], Callable[[ASGIMessage], Awaitable[None]]],
    Awaitable[None],
]
# scope["extensions"]: the server takes {"type": "websocket.send", "texts": [...]}, each text
# its own message, all in one write.
SEND_MANY: Final = "trio_gateway.websocket.send_many"
READ_BYTES: Final = 65536
# Messages read and not yet taken by the app: past it, reading waits (and so does the client).
INBOUND_MESSAGES: Final = 16
# After the close, how long the client may take to answer it before the connection is closed.
CLOSE_WAIT_S: Final = 2.0


def is_websocket_upgrade(head: RequestHead) -> bool:
    """A WebSocket upgrade (not h2c): the ``Upgrade`` header names ``websocket``."""
    return head.method == "GET" and any(
        name == b"upgrade" and value.strip().lower() == b"websocket" for name, value in head.headers
    )


def serves_here(head: RequestHead, paths: frozenset[str]) -> bool:
    """Whether ``head`` is a WebSocket upgrade to one of ``paths``, which the gateway's server
    serves itself (the rest go to hypercorn)."""
    if not paths or not is_websocket_upgrade(head):
        return False
    path = unquote(head.target.partition(b"?")[0].decode("ascii", "replace"))
    return path.rstrip("/") in paths


class Handshake:
    """What an upgrade asks for, and whether it is one RFC 6455 allows (as hypercorn reads
    it)."""

    def __init__(self, head: RequestHead) -> None:
        self.head = head
        self.connection: list[str] = []
        self.extensions: list[str] | None = None
        self.key: bytes | None = None
        self.subprotocols: list[str] = []
        self.version: bytes | None = None
        for name, value in head.headers:
            if name == b"connection":
                self.connection += split_comma_header(value)
            elif name == b"sec-websocket-extensions":
                self.extensions = [*(self.extensions or []), *split_comma_header(value)]
            elif name == b"sec-websocket-key":
                self.key = value
            elif name == b"sec-websocket-protocol":
                self.subprotocols += split_comma_header(value)
            elif name == b"sec-websocket-version":
                self.version = value

    def problem(self) -> str | None:
        if self.head.http_version != "1.1":
            return "a WebSocket upgrade needs HTTP/1.1"
        if not any(token.lower() == "upgrade" for token in self.connection):
            return "a WebSocket upgrade needs 'Connection: Upgrade'"
        if self.key is None:
            return "a WebSocket upgrade needs a Sec-WebSocket-Key"
        if self.version != WEBSOCKET_VERSION:
            return "this server speaks WebSocket version 13 (Sec-WebSocket-Version)"
        return None

    def accept(
        self, subprotocol: str | None, headers: list[tuple[bytes, bytes]], date: bytes
    ) -> tuple[bytes, Connection, bool]:
        """The 101's bytes, the connection's frames from then on (permessage-deflate when the
        client offered it), and whether an extension was accepted."""
        assert self.key is not None
        out = [
            b"HTTP/1.1 101 Switching Protocols\r\n",
            b"upgrade: websocket\r\nconnection: Upgrade\r\n",
            b"sec-websocket-accept: " + generate_accept_token(self.key) + b"\r\n",
            b"date: " + date + b"\r\n",
        ]
        if subprotocol is not None:
            if subprotocol not in self.subprotocols:
                raise ValueError(f"subprotocol {subprotocol!r} was not offered")
            out.append(b"sec-websocket-protocol: " + subprotocol.encode() + b"\r\n")
        extensions: list[Extension] = [PerMessageDeflate()]
        accepted = None
        if self.extensions is not None:
            accepted = server_extensions_handshake(self.extensions, extensions)
            if accepted:
                out.append(b"sec-websocket-extensions: " + accepted + b"\r\n")
        for name, value in headers:
            out.append(bytes(name) + b": " + bytes(value) + b"\r\n")
        out.append(b"\r\n")
        return b"".join(out), Connection(ConnectionType.SERVER, extensions), bool(accepted)


class WebSocketConnection:
    """One upgraded connection, from its head to its end: the app's ``receive`` and ``send``."""

    def __init__(
        self,
        stream: trio.SocketStream,
        head: RequestHead,
        rest: bytes,
        app: App,
        *,
        client: tuple[str, int] | None,
        local: tuple[str, int] | None,
        date: Callable[[], bytes],
        max_message_chars: int,
    ) -> None:
        self._stream = stream
        self._handshake = Handshake(head)
        self._rest = rest  # frames the client sent right after its head
        self._app = app
        self._client, self._local = client, local
        self._date = date
        self._max_message_chars = max_message_chars
        self._state = "handshake"  # then "open", "closing" (our close sent), "closed"
        self._connection: Connection | None = None
        # No extension (compression) negotiated: text frames are written here, not by wsproto.
        self._plain = False
        self._response: ASGIMessage | None = None  # a denial's head, until its body
        self._connected = False
        self._waiting: trio.Event | None = None  # a write waits for room: the others after it
        self._broken = False
        self._in_send, self._in_receive = trio.open_memory_channel[ASGIMessage](INBOUND_MESSAGES)
        self._disconnected = False
        self._close_code = int(CloseReason.ABNORMAL_CLOSURE)
        self._reader_done = trio.Event()
        self._nursery: trio.Nursery | None = None

    async def serve(self) -> None:
        problem = self._handshake.problem()
        if problem is not None:
            body = b'{"error": {"message": "%s", "type": "invalid_request_error"}}' % (
                problem.encode()
            )
            await self._write(error_response(400, body, date=self._date()))
            return
        head = self._handshake.head
        path, _, query = head.target.partition(b"?")
        scope: ASGIMessage = {
            "type": "websocket",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "scheme": "ws",
            "path": unquote(path.decode("ascii")),
            "raw_path": path,
            "query_string": query,
            "root_path": "",
            "headers": head.headers,
            "client": self._client,
            "server": self._local,
            "subprotocols": self._handshake.subprotocols,
            "extensions": {"websocket.http.response": {}, SEND_MANY: {}},
        }
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await self._app(scope, self.receive, self.send)
            except Exception:
                log.exception("the app failed on a WebSocket to %s", scope["path"][:200])
            if self._state == "handshake":
                await self._write(error_response(500, b"{}", date=self._date()))
            elif self._state == "open":
                await self._send_frame(CloseConnection(code=CloseReason.INTERNAL_ERROR))
            if self._state == "closing":
                # The client answers our close (or hangs up): then the connection ends.
                with trio.move_on_after(CLOSE_WAIT_S):
                    await self._reader_done.wait()
            nursery.cancel_scope.cancel()

    # --- the app's side -----------------------------------------------------------------------
    async def receive(self) -> ASGIMessage:
        if not self._connected:
            self._connected = True
            return {"type": "websocket.connect"}
        if self._disconnected:
            # What was read before the end first; then the end, as often as it is asked for.
            try:
                return self._in_receive.receive_nowait()
            except trio.WouldBlock:
                await trio.lowlevel.checkpoint()
                return {"type": "websocket.disconnect", "code": self._close_code}
        return await self._in_receive.receive()

    async def send(self, message: ASGIMessage) -> None:
        kind = message["type"]
        state = self._state
        if kind == "websocket.send" and state == "open":
            texts = message.get("texts")
            if texts is not None and self._plain:
                await self._write(b"".join([text_frame(text) for text in texts]))
            elif texts is not None:
                await self._send_frames([TextMessage(data=text) for text in texts])
            elif message.get("bytes") is not None:
                await self._send_frame(BytesMessage(data=bytes(message["bytes"])))
            else:
                await self._send_frame(TextMessage(data=message["text"]))
        elif kind == "websocket.accept" and state == "handshake":
            await self._accept(message)
        elif kind == "websocket.close" and state == "open":
            self._state = "closing"
            code = int(message.get("code", CloseReason.NORMAL_CLOSURE))
            await self._send_frame(CloseConnection(code=code, reason=message.get("reason")))
        elif kind == "websocket.close" and state == "handshake":
            self._deny()
            await self._write(error_response(403, b"{}", date=self._date()))
        elif kind == "websocket.http.response.start" and state == "handshake":
            self._response = message
        elif kind == "websocket.http.response.body" and self._response is not None:
            response, self._response = self._response, None
            self._deny()
            body = bytes(message.get("body", b""))
            sent = encode_response_head(
                int(response["status"]),
                list(response.get("headers", [])),
                http_version="1.1",
                keep_alive=False,
                date=self._date(),
            )
            await self._write(sent.data + body)
        elif state in ("closing", "closed") or self._broken:
            return  # the socket has ended: an app may finish what it was saying
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} in state {state!r}")

    def _deny(self) -> None:
        self._state = "closed"
        self._disconnected = True

    async def _accept(self, message: ASGIMessage) -> None:
        head, connection, extended = self._handshake.accept(
            message.get("subprotocol"), list(message.get("headers", [])), self._date()
        )
        self._connection = connection
        self._plain = not extended
        self._state = "open"
        await self._write(head)
        assert self._nursery is not None
        self._nursery.start_soon(self._read)

    # --- writing ------------------------------------------------------------------------------
    async def _send_frame(self, event: Event) -> None:
        await self._send_frames([event])

    async def _send_frames(self, events: list[Event]) -> None:
        connection = self._connection
        assert connection is not None
        plain = self._plain and connection.state is ConnectionState.OPEN
        data = bytearray()
        try:
            for event in events:
                if plain and type(event) is TextMessage:
                    data += text_frame(event.data)
                else:
                    data += connection.send(event)
        except LocalProtocolError:
            return  # closing or closed: the frame has no place any more
        await self._write(bytes(data))

    async def _write(self, data: bytes) -> None:
        """All of ``data``, after every earlier write and before every later one: at once
        when the kernel has room (no checkpoint: the usual case), else as it makes room, which
        the writes after it wait for. Cancellable: a write cut half-way leaves the connection
        unusable, and nothing more is written on it."""
        while self._waiting is not None:
            await self._waiting.wait()
        if self._broken:
            return
        sock = self._stream.socket
        try:
            sent = _send(sock, data)
        except OSError:
            self._broken = True
            return
        if sent == len(data):
            return
        self._waiting = waiting = trio.Event()
        try:
            view = memoryview(data)[sent:]
            while view:
                await trio.lowlevel.wait_writable(sock)
                view = view[_send(sock, view) :]
        except (OSError, trio.ClosedResourceError):
            self._broken = True
        except BaseException:
            self._broken = True
            raise
        finally:
            self._waiting = None
            waiting.set()

    # --- reading ------------------------------------------------------------------------------
    async def _read(self) -> None:
        connection = self._connection
        assert connection is not None
        code = int(CloseReason.ABNORMAL_CLOSURE)
        parts: list[str | bytes] = []
        size = 0
        try:
            data, self._rest = self._rest, b""
            while True:
                if data:
                    connection.receive_data(data)
                    for event in connection.events():
                        if isinstance(event, Message):
                            parts.append(event.data)
                            size += len(event.data)
                            if size > self._max_message_chars:
                                await self._send_frame(
                                    CloseConnection(code=CloseReason.MESSAGE_TOO_BIG)
                                )
                                code = int(CloseReason.MESSAGE_TOO_BIG)
                                return
                            if event.message_finished:
                                await self._in_send.send(_received(parts))
                                parts, size = [], 0
                        elif isinstance(event, Ping):
                            await self._send_frame(event.response())
                        elif isinstance(event, CloseConnection):
                            if connection.state is ConnectionState.REMOTE_CLOSING:
                                await self._send_frame(event.response())
                            code = event.code
                            return
                data = await self._stream.receive_some(READ_BYTES)
                if not data:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._state = "closed"
            self._close_code = code
            self._disconnected = True
            self._reader_done.set()
            # An app waiting in receive() is woken by this; one that was not is told the end
            # by receive() itself (above).
            with contextlib.suppress(trio.WouldBlock):
                self._in_send.send_nowait({"type": "websocket.disconnect", "code": code})


def _received(parts: list[str | bytes]) -> ASGIMessage:
    if parts and isinstance(parts[0], str):
        return {"type": "websocket.receive", "text": "".join(str(p) for p in parts)}
    return {
        "type": "websocket.receive",
        "bytes": b"".join(p for p in parts if isinstance(p, bytes)),
    }


def text_frame(text: str) -> bytes:
    """One whole text message as a server's unmasked frame (RFC 6455 5.2), without extensions:
    what wsproto writes, in a few byte operations instead of its frame machinery."""
    payload = text.encode()
    size = len(payload)
    if size < 126:
        head = bytes((0x81, size))
    elif size < 65536:
        head = struct.pack("!BBH", 0x81, 126, size)
    else:
        head = struct.pack("!BBQ", 0x81, 127, size)
    return head + payload


def _send(sock: trio.socket.SocketType, data: bytes | memoryview) -> int:
    """What the kernel took of ``data`` without waiting (0 when its buffer is full); OSError
    once the connection is gone."""
    fd = sock.fileno()
    if fd < 0:
        raise OSError("the connection is closed")
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
