"""The HTTP/1.1 client (``providers/h1_client.py``) read by read, on scripted streams.

Written for mutation testing (docs/testing.md): ``test_h1_client.py`` drives the client
against real servers, whose reads the kernel may merge or split; here each ``receive_some``
returns exactly one scripted piece, so the limits of ``read_limited``, an empty read that is
only chunk framing, and what becomes of every connection (kept idle or closed, never dropped
open) are pinned exactly. The socket-level cases (a reset, a stale idle connection, TLS's
inner socket) use real sockets.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from trio_gateway.errors import UpstreamProtocolError
from trio_gateway.providers.h1_client import H1Pool, H1Response, Origin, _readable, _socket_of

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
URL = "http://upstream.test/v1/chat/completions"


class Trap(Exception):
    """A read the code under test should never have made."""


class Scripted(trio.abc.Stream):
    """Answers one request: each ``receive_some`` returns the next piece; ``Trap`` past them
    (or where a piece is ``None``)."""

    def __init__(self, pieces: list[bytes | None]) -> None:
        self.pieces = list(pieces)
        self.sent = b""
        self.closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        self.sent += bytes(data)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        if self.closed:
            raise trio.ClosedResourceError
        if not self.pieces or (piece := self.pieces.pop(0)) is None:
            raise Trap("read past what the test allows")
        return piece

    async def aclose(self) -> None:
        self.closed = True
        await trio.lowlevel.checkpoint()


def scripted_pool(*scripts: list[bytes | None], max_idle: int = 4) -> tuple[H1Pool, list[Scripted]]:
    """A pool whose n-th connection plays ``scripts[n]``; the list holds those opened."""
    opened: list[Scripted] = []

    async def connect(origin: Origin) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        stream = Scripted(scripts[len(opened)])
        opened.append(stream)
        return stream

    pool = H1Pool(
        "up",
        max_idle=max_idle,
        idle_expiry_s=60,
        connect_timeout_s=2,
        write_timeout_s=2,
        connect=connect,
    )
    return pool, opened


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def post(pool: H1Pool) -> H1Response:
    return await pool.post(URL, {}, b"{}")


# --- read_limited, one read at a time -----------------------------------------------------


async def test_read_limited_joins_every_read_of_the_body() -> None:
    pool, _ = scripted_pool([HEAD, chunk(b"hel"), chunk(b"lo ") + chunk(b"you"), b"0\r\n\r\n"])
    response = await post(pool)
    assert await response.read_limited(100) == b"hello you"
    assert response.ended


async def test_read_limited_reads_past_a_read_that_is_only_framing() -> None:
    # "5\r\n" alone gives no body bytes, but the body has not ended: read on.
    pool, _ = scripted_pool([HEAD, b"5\r\n", b"hello\r\n0\r\n\r\n"])
    response = await post(pool)
    assert await response.read_limited(100) == b"hello"


async def test_read_limited_stops_reading_once_the_limit_is_reached() -> None:
    # Three bytes, then two: five reached, so the trap after them is never read.
    pool, _ = scripted_pool([HEAD, chunk(b"hel"), chunk(b"lo"), None])
    response = await post(pool)
    assert await response.read_limited(5) == b"hello"
    assert not response.ended


async def test_read_limited_reads_until_the_limit_and_cuts_there() -> None:
    # Five bytes are one short of six: one more read, and the answer is cut at six.
    pool, _ = scripted_pool([HEAD, chunk(b"hello"), chunk(b" world"), None])
    response = await post(pool)
    assert await response.read_limited(6) == b"hello "


# --- what becomes of a connection -----------------------------------------------------------


async def test_a_whole_body_leaves_the_connection_idle_and_the_next_request_takes_it() -> None:
    pool, opened = scripted_pool([HEAD, chunk(b"a") + b"0\r\n\r\n", HEAD, b"0\r\n\r\n"])
    first = await post(pool)
    assert await first.read_limited(10) == b"a"
    await first.aclose()
    assert pool.idle_count() == 1 and not opened[0].closed
    # The script's next pieces answer the second request on the same (in-memory) connection.
    second = await post(pool)
    assert await second.read_limited(10) == b""
    await second.aclose()
    assert len(opened) == 1
    assert opened[0].sent.count(b"POST /v1/chat/completions HTTP/1.1") == 2


async def test_a_connection_past_max_idle_is_closed_not_dropped_open() -> None:
    whole: list[bytes | None] = [HEAD, b"0\r\n\r\n"]
    pool, opened = scripted_pool(whole, whole, whole, max_idle=1)
    responses = [await post(pool) for _ in range(3)]  # three at once: three connections
    for response in responses:
        assert await response.read_limited(10) == b""
        await response.aclose()
    assert len(opened) == 3
    assert pool.idle_count() == 1
    assert [stream.closed for stream in opened] == [False, True, True]


async def test_close_idle_closes_every_idle_connection() -> None:
    whole: list[bytes | None] = [HEAD, b"0\r\n\r\n"]
    pool, _ = scripted_pool(whole, whole)
    responses = [await post(pool) for _ in range(2)]
    for response in responses:
        await response.read_limited(10)
        await response.aclose()
    assert pool.idle_count() == 2
    pool.close_idle()
    assert pool.idle_count() == 0


async def test_a_body_not_read_whole_is_closed() -> None:
    pool, opened = scripted_pool([HEAD, chunk(b"a"), None])
    response = await post(pool)
    assert await response.receive() == [b"a"]
    await response.aclose()
    assert opened[0].closed and pool.idle_count() == 0


async def test_a_body_that_ends_with_bytes_after_it_is_not_reused() -> None:
    # Bytes past the body's end belong to no request: the connection cannot be trusted.
    pool, opened = scripted_pool([HEAD + b"0\r\n\r\nHTTP/1.1 200 OK\r\n"])
    response = await post(pool)
    await response.aclose()
    assert opened[0].closed and pool.idle_count() == 0


# --- sockets: reset, stale, TLS --------------------------------------------------------------


@asynccontextmanager
async def resetting_server() -> AsyncIterator[str]:
    """Reads a request, then resets the connection (SO_LINGER 0: an RST, not a FIN)."""

    async def serve(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
        nursery.cancel_scope.cancel()


async def test_a_reset_before_any_answer_names_the_socket_error() -> None:
    async with resetting_server() as url:
        client = H1Pool("up", max_idle=4, idle_expiry_s=60, connect_timeout_s=2, write_timeout_s=2)
        with pytest.raises(UpstreamProtocolError) as caught:
            await client.post(url, {}, b"{}")
    # The socket's own error, not trio's wrapper of it ("socket connection broken: ...").
    assert caught.value.message == "up: connection lost ([Errno 104] Connection reset by peer)"


async def test_a_connection_closed_under_a_read_is_named_by_its_exception() -> None:
    pool, opened = scripted_pool([HEAD, chunk(b"a"), None])
    response = await post(pool)
    assert await response.receive() == [b"a"]
    opened[0].closed = True  # closed by someone else: trio.ClosedResourceError, no message
    with pytest.raises(UpstreamProtocolError) as caught:
        await response.receive()
    assert caught.value.message == "up: connection lost (ClosedResourceError)"


async def test_a_stale_idle_connection_is_closed_when_found() -> None:
    served: list[trio.SocketStream] = []
    dialed: list[trio.SocketStream] = []

    async def serve(stream: trio.SocketStream) -> None:
        served.append(stream)
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        await stream.send_all(HEAD + b"0\r\n\r\n")
        if len(served) == 1:
            await stream.aclose()  # the server's idle timeout, at once
        else:
            await trio.sleep_forever()

    async def connect(origin: Origin) -> trio.abc.Stream:
        stream = await trio.open_tcp_stream(origin.host, origin.port)
        dialed.append(stream)
        return stream

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        url = f"http://127.0.0.1:{port}/v1"
        client = H1Pool(
            "up",
            max_idle=4,
            idle_expiry_s=60,
            connect_timeout_s=2,
            write_timeout_s=2,
            connect=connect,
        )
        first = await client.post(url, {}, b"{}")
        await first.read_limited(10)
        await first.aclose()
        with trio.fail_after(5):  # the server's FIN arrives
            await trio.lowlevel.wait_readable(dialed[0].socket)
        second = await client.post(url, {}, b"{}")
        await second.aclose()
        nursery.cancel_scope.cancel()
    assert len(dialed) == 2
    assert dialed[0].socket.fileno() == -1  # closed when found stale, not left to the GC


async def test_a_tls_stream_is_looked_at_through_its_socket() -> None:
    a, b = socket.socketpair()
    with a, b:
        inner = trio.SocketStream(trio.socket.from_stdlib_socket(a))
        tls = trio.SSLStream(inner, ssl.create_default_context(), server_hostname="x")
        assert _socket_of(tls) is inner.socket
        assert not _readable(tls)
        b.close()
        assert _readable(tls)  # a TLS connection the server closed is stale too
