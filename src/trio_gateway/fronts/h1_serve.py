"""The gateway's own HTTP/1.x server: one task per connection, the ASGI app called directly.

hypercorn serves a request through a task of its own for the app, memory channels for its
messages, an idle-timer task restarted per request and four awaiting layers per write: 2.06M
instructions per request with an app that does nothing, twice the whole per-request budget of
issue 12 (docs/benchmarks.md, scenario A). Here a connection is one loop in one task: read a head
(``h1_parse.py``), call the app with a ``receive`` and a ``send`` that read and write the socket
themselves, write the answer with one non-blocking ``send`` where the kernel has room, and go on
to the next request of a keep-alive connection.

What this server does not speak it hands on, with the bytes it read, to hypercorn's own
connection handler: a WebSocket upgrade (the gateway's ``/v1/ws``), any other ``Upgrade`` (h2c),
and HTTP/2 with prior knowledge. Both serve the same app on the same port.

ASGI as the app needs it (ASGI 3.0, the ``http`` scope): ``receive`` gives the body as it comes,
then waits until the client goes away (``http.disconnect``, which is also what it gives once the
answer has been sent, as hypercorn does); ``send`` takes ``http.response.start`` and
``http.response.body``. A body the app sends without a ``content-length`` is chunked (HTTP/1.1)
or ends with the connection (HTTP/1.0); the head of such an answer is written at once, so the
app may write the body's chunks to the socket itself (``direct.py``) before it ends the body
here. The connection is kept only after a whole request was read and a whole answer written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from typing import Any
from urllib.parse import unquote

import trio

from trio_gateway.chunked import ChunkedBody, H1Error
from trio_gateway.fronts.h1_parse import (
    H2_PREFACE_LINE,
    MAX_HEAD_BYTES,
    RequestHead,
    RequestHeadError,
    ResponseHead,
    encode_response_head,
    error_response,
    find_head_end,
    parse_request_head,
)

log = logging.getLogger("trio_gateway")

READ_BYTES = 65536
_HANG_UP = getattr(select, "EPOLLRDHUP", 0) | select.EPOLLHUP | select.EPOLLERR
HANG_UP_EXTENSION = "trio_gateway.hang_ups"  # scope["extensions"]: the server's HangUps
SOCKET_FD_EXTENSION = "trio_gateway.socket_fd"  # and the connection's descriptor, to watch
# A look at the hang-up set every this many chunks written: at ~75 µs a chunk, every 2.4 ms of a
# burst.
TICKS_PER_POLL = 32
MAX_HANG_UPS_PER_POLL = 1024
# A closing connection's unread bytes are read and dropped for this long, or this many.
LINGER_S = 2.0
LINGER_BYTES = 1 << 20
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
ASGI = {"version": "3.0", "spec_version": "2.3"}

Message = MutableMapping[str, Any]
App = Callable[
    [Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]
HandOff = Callable[[trio.abc.Stream], Awaitable[None]]


class HangUps:
    """Which clients hung up, for every answer at once: the connections whose answer is being
    given, in one ``epoll`` set of their own that reports only a peer's end (``EPOLLRDHUP``, and
    the hang-ups and errors epoll always reports), waited on by one task (:meth:`serve`).

    A disconnect watcher per request costs a task, its coroutines and a cancel scope, some
    3.5 KiB, held as long as the answer: at thousands of streams, a tenth of each one's memory
    (docs/benchmarks.md, scenario D). Where the platform has no ``EPOLLRDHUP`` (or the service
    is not running), requests keep watching ``receive()`` themselves.

    The set is also looked at by whoever is busiest (:meth:`tick`, once per chunk written): a
    burst of thousands of chunks is one long turn of trio's run loop, and a hang-up that came
    during it would otherwise wait for the turn to end before :meth:`serve` even ran."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "EPOLLRDHUP") else None
        self._callbacks: dict[int, Callable[[], object]] = {}
        self._ticks = 0
        self.running = False

    def __len__(self) -> int:
        return len(self._callbacks)

    def watch(self, fd: int, callback: Callable[[], object]) -> None:
        """Call ``callback`` once when the peer of the socket ``fd`` hangs up (until
        :meth:`unwatch`). It is called from another task: it may cancel and close, not wait."""
        epoll = self._epoll
        assert epoll is not None
        try:
            epoll.register(fd, _HANG_UP)
        except FileExistsError:
            epoll.modify(fd, _HANG_UP)  # a watch whose unwatch never came: this one replaces it
        except (OSError, ValueError):
            callback()  # closed already (fd -1, or gone): its client has left
            return
        self._callbacks[fd] = callback

    def unwatch(self, fd: int, callback: Callable[[], object]) -> None:
        """Stop :meth:`watch`'s ``callback`` (not a later watch of the same descriptor)."""
        if self._callbacks.get(fd) is callback:
            del self._callbacks[fd]
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)  # type: ignore[union-attr]

    def poll(self) -> None:
        """Call the callbacks of the hang-ups that have come, now."""
        epoll = self._epoll
        if epoll is None or not self.running:
            return
        for fd, _ in epoll.poll(0, MAX_HANG_UPS_PER_POLL):
            callback = self._callbacks.pop(fd, None)
            with contextlib.suppress(OSError, ValueError):
                epoll.unregister(fd)
            if callback is not None:
                callback()

    def tick(self) -> None:
        """One unit of work done (a chunk written): every ``TICKS_PER_POLL``, a look at the set,
        one ``epoll_wait`` that does not wait (about a microsecond)."""
        self._ticks += 1
        if self._ticks >= TICKS_PER_POLL:
            self._ticks = 0
            if self._callbacks:
                self.poll()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        epoll = self._epoll
        if epoll is None:
            task_status.started()
            return
        self.running = True
        try:
            task_status.started()
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                self.poll()
        finally:
            self.running = False
            epoll.close()


class _Closed(Exception):
    """The client's side is gone (reset, closed, or silent past a deadline)."""


class H1Server:
    """Serves the HTTP/1.x connections of one listening socket.

    ``keep_alive_timeout_s`` bounds the wait for a request's head (the first one's too) and
    between the pieces of its body; ``write_timeout_s`` a write the kernel will not take.
    :meth:`terminate` (the end of a drain): connections waiting for a request close, the
    others close after the answer they are giving."""

    def __init__(
        self,
        app: App,
        hand_off: HandOff,
        *,
        keep_alive_timeout_s: float,
        write_timeout_s: float,
    ) -> None:
        self.app = app
        self.hand_off = hand_off
        self.keep_alive_timeout_s = keep_alive_timeout_s
        self.write_timeout_s = write_timeout_s
        self.terminated = False
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
        try:
            self.client: tuple[str, int] | None = _address(self.sock.getpeername())
            self.local: tuple[str, int] | None = _address(self.sock.getsockname())
        except OSError:
            self.client = self.local = None

    async def run(self) -> None:
        try:
            server = self.server
            while not server.terminated:
                read = await self._read_head()
                if read is None:
                    return
                buffer, end, body_at = read
                del read
                if buffer[:end] == H2_PREFACE_LINE:
                    await server.hand_off(_Replay(self.stream, buffer))
                    return
                try:
                    head = parse_request_head(buffer[:end])
                except RequestHeadError as exc:
                    await self._refuse(exc.status, exc.message)
                    await self._linger()
                    return
                if head.upgrade:
                    await server.hand_off(_Replay(self.stream, buffer))
                    return
                request = _Request(self, head, buffer[body_at:])
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

    async def _linger(self) -> None:
        """Close gently: what the client sent and nobody read (a body refused before it was
        read, a pipelined request) would make the kernel answer the close with a reset, which
        can destroy the answer just written before the client reads it. So: our end first, then
        read and drop what comes, briefly, until the client closes too."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return
        dropped = 0
        with trio.move_on_after(LINGER_S):
            while dropped < LINGER_BYTES:
                try:
                    data = await _read(self.sock)
                except _Closed:
                    return
                if not data:
                    return
                dropped += len(data)

    async def _read_head(self) -> tuple[bytes, int, int] | None:
        """What was read (taken from ``self.buffer``), the end of the next head in it and where
        what follows the head starts; None when the client closed or went quiet, or the server
        is stopping."""
        buffer = self.buffer
        searched = 0
        with trio.CancelScope() as idle:
            idle.deadline = trio.current_time() + self.server.keep_alive_timeout_s
            self.server._idle.add(idle)
            try:
                while True:
                    found = find_head_end(buffer, searched)
                    if found is not None and found[0] <= MAX_HEAD_BYTES:
                        self.buffer = b""
                        return buffer, found[0], found[1]
                    if found is not None or len(buffer) > MAX_HEAD_BYTES:
                        await self._refuse(
                            431, f"a request head larger than {MAX_HEAD_BYTES} bytes"
                        )
                        await self._linger()
                        return None
                    searched = len(buffer)
                    data = await _read(self.sock)
                    if not data:
                        return None
                    buffer += data
            finally:
                self.server._idle.discard(idle)
        return None  # the deadline, or the server's end

    async def _refuse(self, status: int, message: str) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "code": "malformed_http",
                    "param": None,
                }
            }
        ).encode()
        with trio.move_on_after(self.server.write_timeout_s):
            await _write(self.sock, error_response(status, body, date=self.server.date()))


class _Request:
    """One request on a connection: its ASGI scope, ``receive`` and ``send``."""

    def __init__(self, conn: _Connection, head: RequestHead, rest: bytes) -> None:
        self.conn = conn
        self.head = head
        self.rest = rest  # read past the head: the body's first bytes, maybe more
        self.body_done = head.framing == "none"  # read whole from the socket
        self.body_given = False  # and handed to the app whole
        self.remaining = head.content_length if head.framing == "length" else 0
        self.chunked = ChunkedBody() if head.framing == "chunked" else None
        self.pipelined = b""  # the next request's bytes, read while waiting for a disconnect
        self.continue_sent = not head.expect_continue
        self.response: ResponseHead | None = None
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
        except Exception:
            log.exception("the app failed on %s %s", head.method, scope["path"][:200])
            self.broken = True
            if self.response is None:
                await self.conn._refuse(500, "internal error")

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
        # The last piece, or the one empty message of a request without a body.
        self.body_given = self.body_done
        return {"type": "http.request", "body": body, "more_body": not self.body_done}

    async def _body_piece(self) -> bytes:
        if not self.continue_sent:
            self.continue_sent = True
            if self.response is None:
                await self._write(CONTINUE)
        while True:
            data, self.rest = self.rest, b""
            if not data:
                with trio.move_on_after(self.conn.server.keep_alive_timeout_s) as late:
                    data = await _read(self.conn.sock)
                if late.cancelled_caught or not data:
                    raise _Closed
            if self.chunked is not None:
                try:
                    pieces = self.chunked.feed(data)
                except H1Error as exc:
                    self.broken = True
                    raise _Closed from exc
                if self.chunked.done:
                    self.body_done = True
                    self.rest = self.chunked.leftover
                body = b"".join(pieces)
            else:
                body, self.rest = data[: self.remaining], data[self.remaining :]
                self.remaining -= len(body)
                self.body_done = not self.remaining
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
                keep_alive=self.head.keep_alive and not server.terminated,
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
        try:
            with trio.move_on_after(self.conn.server.write_timeout_s) as late:
                await _write(self.conn.sock, data)
        except _Closed:
            self.broken = self.client_gone = True
            return
        if late.cancelled_caught:
            self.broken = True


async def _read(sock: trio.socket.SocketType) -> bytes:
    """One read: wait, then read (one trip through the scheduler; h1_client.H1Response.receive)."""
    while True:
        await trio.lowlevel.wait_readable(sock)
        try:
            return os.read(sock.fileno(), READ_BYTES)
        except BlockingIOError:
            continue
        except OSError as exc:
            raise _Closed from exc


async def _write(sock: trio.socket.SocketType, data: bytes) -> None:
    """All of ``data`` to the kernel: at once when it has room, else as it makes room. A
    write given up on part-way leaves the connection unusable (the caller closes it)."""
    view = memoryview(data)
    while view:
        fd = sock.fileno()
        if fd < 0:
            raise _Closed
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise _Closed from exc
        view = view[sent:]
        if view:
            await trio.lowlevel.wait_writable(sock)


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
