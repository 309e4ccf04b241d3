"""The gateway's own HTTP/1.x server: one task per connection, the ASGI app called directly.

hypercorn serves a request through a task of its own for the app, memory channels for its
messages, an idle-timer task restarted per request and four awaiting layers per write: 2.06M
instructions per request with an app that does nothing, twice the whole per-request budget of
issue 12 (docs/benchmarks.md, scenario A). Here a connection is one loop in one task: read a head
(parsed by llhttp, ``request.py``), call the app with a ``receive`` and a ``send`` that read and
write the socket themselves, write the answer with one non-blocking ``send`` where the kernel has
room, and go on to the next request of a keep-alive connection.

Every wait for the client is bounded (docs/architecture.md, "The HTTP/1.x edge"): a connection's
first head must be whole within ``head_timeout_s`` of its accept, a later one within
``keep_alive_timeout_s`` of idling plus ``head_timeout_s`` from its first byte, a body within
``body_timeout_s`` of the app's first read. A request the server refuses (its framing, its size,
a deadline) is answered with its status (400, 408, 413, 431, 501, 505) where the client can
still hear it, logged at debug level with the peer, and its connection closed gently (the
client's bytes still coming are read and dropped first, within bounds: ``linger.py``).

What this server does not speak it hands on, with the bytes it read, to hypercorn's own
connection handler: a WebSocket upgrade (the gateway's ``/v1/ws``), any other ``Upgrade`` (h2c),
and HTTP/2 with prior knowledge. Both serve the same app on the same port.

ASGI as the app needs it (ASGI 3.0, the ``http`` scope): ``receive`` gives the body as it comes,
then waits until the client goes away (``http.disconnect``, which is also what it gives once the
answer has been sent, as hypercorn does); ``send`` takes ``http.response.start`` and
``http.response.body``. A body the app sends without a ``content-length`` is chunked (HTTP/1.1)
or ends with the connection (HTTP/1.0); the head of such an answer is written at once, so the
app may write the body's chunks to the socket itself (``direct.py``) before it ends the body
here. The connection is kept only after a whole request was read and a whole answer written; a
response after which it is not says ``connection: close``. A body that turns out malformed or
late reaches the app as an :class:`~trio_gateway.http1.errors.H1Error` from ``receive``: an app
that lets it through has it answered here.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from typing import Any
from urllib.parse import unquote

import trio

from trio_gateway.http1 import linger
from trio_gateway.http1.errors import H1Error
from trio_gateway.http1.hang_ups import HangUps
from trio_gateway.http1.heads import SentHead, encode_response_head, error_response
from trio_gateway.http1.request import (
    H2_PREFACE,
    MAX_HEAD_BYTES,
    RequestHead,
    RequestParser,
    find_head_end,
)
from trio_gateway.http1.websocket import WebSocketConnection, serves_here

log = logging.getLogger("trio_gateway")

READ_BYTES = 65536
HANG_UP_EXTENSION = "trio_gateway.hang_ups"  # scope["extensions"]: the server's HangUps
SOCKET_FD_EXTENSION = "trio_gateway.socket_fd"  # and the connection's descriptor, to watch
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
ASGI = {"version": "3.0", "spec_version": "2.3"}
# The error code a refusal's body names, by its status.
_CODES = {408: "request_timeout", 413: "body_too_large", 500: "internal_error"}

Message = MutableMapping[str, Any]
App = Callable[
    [Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]
HandOff = Callable[[trio.abc.Stream], Awaitable[None]]
# Told of each request the server answers itself (its status and error code), for the access
# log and the metrics: the app never saw it.
OnRefused = Callable[[int, str], None]


class _Closed(Exception):
    """The client's side is gone (reset, closed, or silent past a deadline)."""


class H1Server:
    """Serves the HTTP/1.x connections of one listening socket.

    ``write_timeout_s`` bounds a write the kernel will not take; ``max_body_bytes`` a request's
    body (a larger one declared in the head is refused from the head: 413, no ``100
    Continue``). :meth:`terminate` (the end of a drain): connections waiting for a request
    close, the others close after the answer they are giving."""

    def __init__(
        self,
        app: App,
        hand_off: HandOff,
        *,
        keep_alive_timeout_s: float,
        head_timeout_s: float,
        body_timeout_s: float,
        write_timeout_s: float,
        max_body_bytes: int,
        body_limit_name: str = "the limit",
        on_refused: OnRefused | None = None,
        websocket_paths: frozenset[str] = frozenset(),
        websocket_max_message_chars: int = 16 * 1024 * 1024,
    ) -> None:
        self.app = app
        # WebSocket upgrades served here (http1/websocket.py), not handed to hypercorn.
        self.websocket_paths = websocket_paths
        self.websocket_max_message_chars = websocket_max_message_chars
        self.on_refused = on_refused
        self.hand_off = hand_off
        self.keep_alive_timeout_s = keep_alive_timeout_s
        self.head_timeout_s = head_timeout_s
        self.body_timeout_s = body_timeout_s
        self.write_timeout_s = write_timeout_s
        self.max_body_bytes = max_body_bytes
        self.body_limit_name = body_limit_name  # what a 413 calls max_body_bytes
        self.terminated = False
        self.lingering = 0  # connections lingering now (linger.MAX_LINGERING at most)
        self.closed_unlingered = 0  # connections that found that many lingering
        self.hang_ups = HangUps()  # served by the caller: ``nursery.start(server.hang_ups.serve)``
        self._idle: set[trio.CancelScope] = set()
        self._date = b""
        self._date_at = -1

    def terminate(self) -> None:
        self.terminated = True
        for scope in self._idle:
            scope.cancel()

    def date(self) -> bytes:
        now = int(time.time())
        if now != self._date_at:
            self._date_at = now
            self._date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now)).encode()
        return self._date

    def serve(self, stream: trio.SocketStream) -> Coroutine[Any, Any, None]:
        """Serve one connection until it ends, then close it: the connection's own coroutine,
        not one awaiting it (a frame fewer for each of thousands of connections)."""
        return _Connection(self, stream).run()


class _Connection:
    def __init__(self, server: H1Server, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.sock = stream.socket
        self.buffer = b""  # read, not yet part of a request
        self.parser = RequestParser(
            max_body_bytes=server.max_body_bytes, limit_name=server.body_limit_name
        )
        # The first head's deadline counts from here: a client that connects and sends nothing
        # (or one byte at a time) holds a connection for head_timeout_s at most.
        self.accepted_at = trio.current_time()
        try:
            self.client: tuple[str, int] | None = _address(self.sock.getpeername())
            self.local: tuple[str, int] | None = _address(self.sock.getsockname())
        except OSError:
            self.client = self.local = None

    async def run(self) -> None:
        try:
            server = self.server
            first = True
            while not server.terminated:
                read = await self._read_head(first)
                first = False
                if read is None:
                    return
                buffer, head_end = read
                del read
                if buffer.startswith(H2_PREFACE):
                    await server.hand_off(_Replay(self.stream, buffer))
                    return
                try:
                    head = self.parser.head(buffer[:head_end])
                except H1Error as exc:
                    await self._refuse(exc)
                    return
                if head.upgrade:
                    if serves_here(head, server.websocket_paths):
                        await self._websocket(head, buffer[head_end:])
                    else:
                        await server.hand_off(_Replay(self.stream, buffer))
                    return
                request = _Request(self, head, buffer[head_end:])
                # The request keeps what it needs: the bytes as read are not held through the
                # answer (thousands of answers at once).
                del buffer
                await request.serve()
                if not request.reusable():
                    if not request.client_gone:
                        await self._linger()
                    return
                self.buffer = request.leftover()
        except _Closed:
            pass
        except Exception:
            # One connection's failure is its own: the listener and every other connection
            # go on (the app's own failures are answered with a 500 before this).
            log.exception("HTTP/1.x connection failed")
        finally:
            await trio.aclose_forcefully(self.stream)

    async def _websocket(self, head: RequestHead, rest: bytes) -> None:
        server = self.server
        await WebSocketConnection(
            self.stream,
            head,
            rest,
            server.app,
            client=self.client,
            local=self.local,
            date=server.date,
            max_message_chars=server.websocket_max_message_chars,
        ).serve()

    async def _linger(self) -> None:
        """Close gently (``http1/linger.py``); a drain's end (:meth:`H1Server.terminate`) ends
        it. Past ``MAX_LINGERING`` connections lingering, at once."""
        server = self.server
        if server.lingering >= linger.MAX_LINGERING:
            server.closed_unlingered += 1
            log.debug("%d lingering: %s closes at once", server.lingering, _peer(self.client))
            return
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return
        server.lingering += 1
        with trio.CancelScope() as lingering:
            server._idle.add(lingering)
            try:
                if not server.terminated:
                    await linger.drop_until_closed(self.sock, linger.SERVER_LINGER)
            finally:
                server._idle.discard(lingering)
                server.lingering -= 1

    async def _read_head(self, first: bool) -> tuple[bytes, int] | None:
        """What was read (taken from ``self.buffer``) and where the next head in it ends; None
        when the client closed, went quiet or was refused, or the server is stopping."""
        server = self.server
        buffer = self.buffer
        searched = 0
        with trio.CancelScope() as waiting:
            if first:
                waiting.deadline = self.accepted_at + server.head_timeout_s
            elif buffer:
                waiting.deadline = trio.current_time() + server.head_timeout_s
            else:
                waiting.deadline = trio.current_time() + server.keep_alive_timeout_s
            server._idle.add(waiting)
            try:
                while True:
                    end = find_head_end(buffer, searched)
                    if end is not None and end <= MAX_HEAD_BYTES:
                        self.buffer = b""
                        return buffer, end
                    if end is not None or len(buffer) > MAX_HEAD_BYTES:
                        await self._refuse(
                            H1Error(f"a request head larger than {MAX_HEAD_BYTES} bytes", 431)
                        )
                        return None
                    searched = len(buffer)
                    data = await _read(self.sock)
                    if not data:
                        return None
                    if not buffer and not first:
                        # An idle connection's next request has begun: its head has as long as
                        # any other's.
                        waiting.deadline = trio.current_time() + server.head_timeout_s
                    buffer += data
            finally:
                server._idle.discard(waiting)
        if buffer and not server.terminated:
            await self._refuse(
                H1Error(f"the request head did not come within {server.head_timeout_s:g} s", 408)
            )
        return None  # the deadline, or the server's end

    async def _refuse(self, error: H1Error) -> None:
        """Answer a request the server refuses itself, then close."""
        log.debug("refused a request from %s with %d: %s", _peer(self.client), error.status, error)
        await self._answer_error(error.status, error.message)
        await self._linger()

    async def _answer_error(self, status: int, message: str) -> None:
        code = _CODES.get(status, "malformed_http")
        if self.server.on_refused is not None:
            self.server.on_refused(status, code)
        body = json.dumps(
            {
                "error": {
                    "message": message,
                    "type": "server_error" if status >= 500 else "invalid_request_error",
                    "code": code,
                    "param": None,
                }
            }
        ).encode()
        data = error_response(status, body, date=self.server.date())
        with trio.move_on_after(self.server.write_timeout_s):
            await _write(self.sock, _write_now(self.sock, data))


class _Request:
    """One request on a connection: its ASGI scope, ``receive`` and ``send``."""

    def __init__(self, conn: _Connection, head: RequestHead, rest: bytes) -> None:
        self.conn = conn
        self.head = head
        self.rest = rest  # read past the head: the body's first bytes, maybe more
        self.body_done = conn.parser.body_done  # read whole from the socket
        self.body_given = False  # and handed to the app whole
        self.body_deadline: float | None = None  # set by the app's first read of the body
        self.pipelined = b""  # the next request's bytes, read while waiting for a disconnect
        self.continue_sent = not head.expect_continue
        self.response: SentHead | None = None
        self.pending = b""  # a head kept back to go out with the first body bytes
        self.sent = 0
        self.done = False  # the whole answer was handed to the kernel
        self.broken = False  # a write failed part-way, or the app wrote past its length
        self.client_gone = False
        self._watch: trio.CancelScope | None = None

    def reusable(self) -> bool:
        return (
            self.done
            and self.body_done
            and not self.broken
            and not self.client_gone
            and self.response is not None
            and not self.response.close
            and not self.conn.server.terminated
        )

    def leftover(self) -> bytes:
        return self.rest + self.pipelined

    async def serve(self) -> None:
        head = self.head
        path, _, query = head.target.partition(b"?")
        scope: Message = {
            "type": "http",
            "asgi": ASGI,
            "http_version": head.http_version,
            "method": head.method,
            "scheme": "http",
            "path": unquote(path.decode("ascii")),
            "raw_path": path,
            "query_string": query,
            "root_path": "",
            "headers": head.headers,
            "client": self.conn.client,
            "server": self.conn.local,
            "extensions": self._extensions(),
        }
        try:
            await self.conn.server.app(scope, self.receive, self.send)
        except H1Error as exc:
            # The body's framing or deadline, let through by the app: answered here.
            self.broken = True
            log.debug(
                "refused a request from %s with %d: %s", _peer(self.conn.client), exc.status, exc
            )
            if self.response is None:
                await self.conn._answer_error(exc.status, exc.message)
        except Exception:
            log.exception("the app failed on %s %s", head.method, scope["path"][:200])
            self.broken = True
            if self.response is None:
                await self.conn._answer_error(500, "internal error")

    def _extensions(self) -> dict[str, Any]:
        hang_ups = self.conn.server.hang_ups
        if not hang_ups.running:
            return {}
        return {HANG_UP_EXTENSION: hang_ups, SOCKET_FD_EXTENSION: self.conn.sock.fileno()}

    # --- receive ------------------------------------------------------------------------------

    async def receive(self) -> Message:
        if self.body_given:
            return await self._wait_disconnect()
        body = b""
        if not self.body_done:
            try:
                body = await self._body_piece()
            except _Closed:
                self.client_gone = True
                return {"type": "http.disconnect"}
            except H1Error:
                self.broken = True  # the connection's framing is lost: it closes after this
                raise
        # The last piece, or the one empty message of a request without a body.
        self.body_given = self.body_done
        return {"type": "http.request", "body": body, "more_body": not self.body_done}

    async def _body_piece(self) -> bytes:
        server = self.conn.server
        if self.body_deadline is None:
            self.body_deadline = trio.current_time() + server.body_timeout_s
        if not self.continue_sent:
            self.continue_sent = True
            if self.response is None:
                await self._write(CONTINUE)
        parser = self.conn.parser
        while True:
            data, self.rest = self.rest, b""
            if not data:
                with trio.CancelScope(deadline=self.body_deadline) as late:
                    data = await _read(self.conn.sock)
                if late.cancelled_caught:
                    raise H1Error(
                        f"the request body did not come within {server.body_timeout_s:g} s", 408
                    )
                if not data:
                    raise _Closed
            pieces, used = parser.body(data)
            if used < len(data):
                self.rest = data[used:]
            self.body_done = parser.body_done
            body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            if body or self.body_done:
                return body

    async def _wait_disconnect(self) -> Message:
        """Until the client goes away or the answer has been sent; a pipelined next request
        read meanwhile is kept (up to a head's bound, then the socket is left alone)."""
        sock = self.conn.sock
        while not self.done and not self.client_gone:
            with trio.CancelScope() as self._watch:
                if len(self.pipelined) > MAX_HEAD_BYTES:
                    await trio.sleep_forever()
                await trio.lowlevel.wait_readable(sock)
            self._watch = None
            if self.done:
                break
            try:
                data = os.read(sock.fileno(), READ_BYTES)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self.client_gone = True
                break
            self.pipelined += data
        return {"type": "http.disconnect"}

    # --- send ---------------------------------------------------------------------------------

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.response is not None:
                raise RuntimeError("http.response.start sent twice")
            server = self.conn.server
            self.response = encode_response_head(
                int(message["status"]),
                message.get("headers", ()),
                http_version=self.head.http_version,
                # A body not read whole (an answer that did not need it, a framing error) ends
                # the connection after this answer, and the answer says so.
                keep_alive=self.head.keep_alive
                and self.body_done
                and not self.broken
                and not server.terminated,
                date=server.date(),
                head_request=self.head.method == "HEAD",
            )
            if self.response.framing in ("chunked", "close"):
                # A stream: its head goes now (the app may write the body itself, direct.py),
                # and is not held through the answer.
                data, self.response.data = self.response.data, b""
                await self._write(data)
            else:
                self.pending = self.response.data
        elif kind == "http.response.body":
            response = self.response
            if response is None:
                raise RuntimeError("http.response.body before http.response.start")
            if self.done:
                return
            body = bytes(message.get("body", b""))
            more = bool(message.get("more_body", False))
            framing = response.framing
            if framing == "chunked":
                data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
                if not more:
                    data += b"0\r\n\r\n"
            elif framing == "none":
                data = b""
            else:
                data = body
                self.sent += len(body)
                if framing == "length" and self.sent > response.content_length:
                    self.broken = True  # the app wrote past its own content-length
                    raise RuntimeError("more body than the content-length")
            if self.pending:
                data, self.pending = self.pending + data, b""
            if data:
                self.conn.server.hang_ups.tick()
                await self._write(data)
            if not more:
                if framing == "length" and self.sent < response.content_length:
                    self.broken = True
                self.done = True
                if self._watch is not None:
                    self._watch.cancel()
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")

    async def _write(self, data: bytes) -> None:
        # A write taken at once has no checkpoint to cancel: a scope (~55K instructions) for a wait.
        try:
            if not (rest := _write_now(self.conn.sock, data)):
                return
            with trio.move_on_after(self.conn.server.write_timeout_s) as late:
                await _write(self.conn.sock, rest)
        except _Closed:
            self.broken = self.client_gone = True
            return
        if late.cancelled_caught:
            self.broken = True


def _peer(client: tuple[str, int] | None) -> str:
    return "-" if client is None else f"{client[0]}:{client[1]}"


async def _read(sock: trio.socket.SocketType) -> bytes:
    """One read: wait, then read (one trip through the scheduler; client.H1Response.receive)."""
    while True:
        await trio.lowlevel.wait_readable(sock)
        try:
            return os.read(sock.fileno(), READ_BYTES)
        except BlockingIOError:
            continue
        except OSError as exc:
            raise _Closed from exc


def _write_now(sock: trio.socket.SocketType, data: bytes | memoryview) -> memoryview:
    """What the kernel does not take of ``data`` at once (empty: all of it went)."""
    if (fd := sock.fileno()) < 0:
        raise _Closed
    try:
        return memoryview(data)[os.write(fd, data) :]
    except BlockingIOError:
        return memoryview(data)
    except OSError as exc:
        raise _Closed from exc


async def _write(sock: trio.socket.SocketType, rest: memoryview) -> None:
    """What :func:`_write_now` left, as the kernel makes room (given up: the caller closes)."""
    while rest:
        await trio.lowlevel.wait_writable(sock)
        rest = _write_now(sock, rest)


def _address(address: Any) -> tuple[str, int] | None:
    if isinstance(address, tuple) and len(address) >= 2:
        return (str(address[0]), int(address[1]))
    return None


class _Replay(trio.abc.HalfCloseableStream):
    """A connection handed to hypercorn: the bytes already read come first. hypercorn looks
    for ``socket`` (peer and local addresses) and, on TLS streams only, ``do_handshake``."""

    def __init__(self, stream: trio.SocketStream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix
        self.socket = stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            await trio.lowlevel.checkpoint()
            return data
        return bytes(await self._stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()
