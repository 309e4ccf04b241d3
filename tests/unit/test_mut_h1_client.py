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

from trio_gateway.core.errors import UpstreamProtocolError, UpstreamUnreachable
from trio_gateway.http1.client import (
    H1Pool,
    H1Response,
    Origin,
    _readable,
    _socket_of,
    encode_request,
    split_url,
)

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
URL = "http://upstream.test/v1/chat/completions"


RESET = b"<the peer resets the connection>"  # a piece that is a reset, not bytes


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
        if piece is RESET:
            raise trio.BrokenResourceError("socket connection broken") from ConnectionResetError(
                104, "Connection reset by peer"
            )
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


async def test_idle_connections_past_their_expiry_are_closed_while_nothing_else_happens(
    autojump_clock: trio.abc.Clock,
) -> None:
    whole: list[bytes | None] = [HEAD, b"0\r\n\r\n"]
    pool, _ = scripted_pool(whole, whole, whole)
    first, second = await post(pool), await post(pool)
    await first.read_limited(10)
    await first.aclose()  # idle from 0 s
    await trio.sleep(30)
    await second.read_limited(10)
    await second.aclose()  # idle from 30 s
    assert pool.idle_count() == 2
    await trio.sleep(29.9)
    assert pool.close_expired() == 0
    await trio.sleep(0.1)
    assert pool.close_expired() == 1  # the first, at exactly 60 s
    assert pool.idle_count() == 1
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.expire_idle)
        await trio.sleep(2 * pool.idle_expiry_s)
        assert pool.idle_count() == 0  # the service's own look closed the second
        nursery.cancel_scope.cancel()
    # A new request dials anew: nothing stale was left to take.
    third = await post(pool)
    await third.read_limited(10)


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
    assert await response.read_limited(10) == b""
    assert response.ended
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
    assert caught.value.provider == "up"


async def test_a_connection_closed_under_a_read_is_named_by_its_exception() -> None:
    pool, opened = scripted_pool([HEAD, chunk(b"a"), None])
    response = await post(pool)
    assert await response.receive() == [b"a"]
    opened[0].closed = True  # closed by someone else: trio.ClosedResourceError, no message
    with pytest.raises(UpstreamProtocolError) as caught:
        await response.receive()
    assert caught.value.message == "up: connection lost (ClosedResourceError)"
    assert caught.value.provider == "up"


async def test_a_body_framed_by_the_connection_s_end_ends_there() -> None:
    pool, opened = scripted_pool(
        [b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", b"hel", b"lo", b"", None]
    )
    response = await post(pool)
    assert await response.read_limited(100) == b"hello"
    assert response.ended
    assert await response.receive() == []  # and stays ended, without reading again
    await response.aclose()
    assert opened[0].closed and pool.idle_count() == 0


async def test_a_broken_chunk_is_a_protocol_error_of_the_provider() -> None:
    pool, _ = scripted_pool([HEAD, b"zz\r\n"])
    response = await post(pool)
    with pytest.raises(UpstreamProtocolError) as caught:
        await response.receive()
    assert caught.value.message.startswith("up: ")
    assert caught.value.provider == "up"


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


# --- sending, and a reused connection that fails ----------------------------------------------


class Unwritable(Scripted):
    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.sleep_forever()


async def test_a_request_that_cannot_be_sent_in_time_is_a_protocol_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def connect(origin: Origin) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        return Unwritable([])

    client = H1Pool(
        "up",
        max_idle=4,
        idle_expiry_s=60,
        connect_timeout_s=2,
        write_timeout_s=0.5,
        connect=connect,
    )
    with pytest.raises(UpstreamProtocolError) as caught:
        await client.post(URL, {}, b"{}")
    assert caught.value.message == "up: the request could not be sent within 0.5 s"
    assert caught.value.provider == "up"


async def test_a_new_connection_closed_without_an_answer_is_the_provider_s_error() -> None:
    pool, _ = scripted_pool([b""])
    with pytest.raises(UpstreamProtocolError) as caught:
        await post(pool)
    assert caught.value.message == (
        "up: connection lost (server disconnected without sending a response)"
    )
    assert caught.value.provider == "up"


async def test_a_reused_connection_cut_inside_the_answer_s_head_is_not_sent_again() -> None:
    # Bytes of an answer came: the server did take the request, so it is not sent anew
    # (only a connection that failed before any byte is).
    pool, opened = scripted_pool([HEAD, b"0\r\n\r\n", b"HTTP/1.1 2", b""])
    first = await post(pool)
    assert await first.read_limited(10) == b""
    await first.aclose()
    assert pool.idle_count() == 1
    with pytest.raises(UpstreamProtocolError, match="server disconnected without sending"):
        await post(pool)
    assert len(opened) == 1


# --- URLs, the request's bytes, dialling, idle expiry -----------------------------------------


@pytest.mark.parametrize(
    ("url", "origin", "target", "host"),
    [
        ("http://h/x", Origin("http", "h", 80), "/x", "h"),
        ("https://h", Origin("https", "h", 443), "/", "h"),
        ("http://h:8000/v1?a=b", Origin("http", "h", 8000), "/v1?a=b", "h:8000"),
        ("https://h:443/x", Origin("https", "h", 443), "/x", "h"),
        ("http://h:443/x", Origin("http", "h", 443), "/x", "h:443"),
        ("https://h:80/x", Origin("https", "h", 80), "/x", "h:80"),
        ("http://h/x?", Origin("http", "h", 80), "/x", "h"),
        ("http://[::1]:8000/v1", Origin("http", "::1", 8000), "/v1", "[::1]:8000"),
        ("https://[::1]/v1", Origin("https", "::1", 443), "/v1", "[::1]"),
        ("HTTPS://h/x", Origin("https", "h", 443), "/x", "h"),
    ],
)
def test_split_url(url: str, origin: Origin, target: str, host: str) -> None:
    assert split_url(url) == (origin, target, host)


@pytest.mark.parametrize("url", ["ftp://h/x", "http:///x", "h:80/x", "//h/x"])
def test_split_url_refuses_what_is_not_http(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        split_url(url)
    assert str(caught.value) == f"not an http(s) URL: {url!r}"


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-a", "1\r2"), ("x-a", "1\n2"), ("x\ra", "1"), ("x\na", "1"), ("x:a", "1")],
)
async def test_a_header_that_would_break_the_request_is_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError) as caught:
        encode_request("/", "h", {name: value}, b"")
    assert str(caught.value) == f"header {name!r} holds a line break or a colon"
    pool, opened = scripted_pool([])
    with pytest.raises(UpstreamProtocolError) as refused:
        await pool.post(URL, {name: value}, b"{}")
    assert refused.value.message == f"up: header {name!r} holds a line break or a colon"
    assert refused.value.provider == "up"
    assert opened == []  # refused before any connection


def test_the_request_s_own_framing_headers_cannot_be_replaced() -> None:
    wire = encode_request("/v1", "h", {"Content-Length": "1", "HOST": "x", "x-b": "é"}, b"\xc3\xa9")
    assert wire == (
        b"POST /v1 HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\nx-b: \xe9\r\n"
        b"accept-encoding: identity\r\n\r\n\xc3\xa9"
    )


async def dial_failure(exc: BaseException) -> UpstreamUnreachable:
    async def connect(origin: Origin) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        raise exc

    client = H1Pool(
        "up", max_idle=1, idle_expiry_s=1, connect_timeout_s=2, write_timeout_s=2, connect=connect
    )
    with pytest.raises(UpstreamUnreachable) as caught:
        await client.post(URL, {}, b"{}")
    assert caught.value.provider == "up"
    return caught.value


async def test_dialling_failures_are_named() -> None:
    refused = await dial_failure(ConnectionRefusedError(111, "Connection refused"))
    assert refused.message == "up: cannot connect ([Errno 111] Connection refused)"
    broken = trio.BrokenResourceError("wrapper")
    broken.__cause__ = OSError("handshake cut")
    assert (await dial_failure(broken)).message == "up: cannot connect (handshake cut)"
    bare = await dial_failure(trio.BrokenResourceError())
    assert bare.message == "up: cannot connect (connection refused)"
    bad_record = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    tls = await dial_failure(bad_record)
    assert tls.message == f"up: cannot connect ({bad_record})"


async def test_dialling_that_takes_too_long_is_a_connect_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def connect(origin: Origin) -> trio.abc.Stream:
        await trio.sleep(10)
        raise AssertionError("not reached")

    client = H1Pool(
        "up", max_idle=1, idle_expiry_s=1, connect_timeout_s=2, write_timeout_s=2, connect=connect
    )
    start = trio.current_time()
    with pytest.raises(UpstreamUnreachable) as caught:
        await client.post(URL, {}, b"{}")
    assert trio.current_time() - start == pytest.approx(2)
    assert (caught.value.message, caught.value.provider) == ("up: connect timed out", "up")


@pytest.mark.parametrize(("idle_s", "reused"), [(1.9, True), (2.0, False)])
async def test_an_idle_connection_expires_after_idle_expiry_s(
    autojump_clock: trio.abc.Clock, idle_s: float, reused: bool
) -> None:
    whole: list[bytes | None] = [HEAD, b"0\r\n\r\n", HEAD, b"0\r\n\r\n"]
    opened: list[Scripted] = []

    async def connect(origin: Origin) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        opened.append(Scripted(whole))
        return opened[-1]

    client = H1Pool(
        "up", max_idle=1, idle_expiry_s=2, connect_timeout_s=2, write_timeout_s=2, connect=connect
    )
    first = await client.post(URL, {}, b"{}")
    await first.read_limited(10)
    await first.aclose()
    await trio.sleep(idle_s)
    second = await client.post(URL, {}, b"{}")
    await second.read_limited(10)
    assert len(opened) == (1 if reused else 2)


async def test_idle_connections_are_kept_per_origin() -> None:
    whole: list[bytes | None] = [HEAD, b"0\r\n\r\n", HEAD, b"0\r\n\r\n"]
    pool, opened = scripted_pool(whole, whole, whole)
    for url in (URL, "http://other.test/v1", URL, "http://other.test/v1"):
        response = await pool.post(url, {}, b"{}")
        await response.read_limited(10)
        await response.aclose()
    assert len(opened) == 2
    assert [s.sent.count(b"POST") for s in opened] == [2, 2]
    assert b"host: other.test" in opened[1].sent


async def test_close_idle_closes_the_sockets() -> None:
    a, b = socket.socketpair()
    b.sendall(HEAD + b"0\r\n\r\n")  # the answer waits in the socket before the request

    async def connect(origin: Origin) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        return trio.SocketStream(trio.socket.from_stdlib_socket(a))

    client = H1Pool(
        "up", max_idle=1, idle_expiry_s=60, connect_timeout_s=2, write_timeout_s=2, connect=connect
    )
    response = await client.post(URL, {}, b"{}")
    await response.read_limited(10)
    await response.aclose()
    assert client.idle_count() == 1 and a.fileno() != -1
    client.close_idle()
    assert client.idle_count() == 0 and a.fileno() == -1
    b.close()


async def test_a_reused_connection_reset_before_any_byte_is_replaced_once() -> None:
    pool, opened = scripted_pool([HEAD, b"0\r\n\r\n", RESET], [HEAD, chunk(b"a"), b"0\r\n\r\n"])
    first = await post(pool)
    await first.read_limited(10)
    await first.aclose()
    second = await post(pool)  # the idle one is reset: sent again, on a new connection
    assert await second.read_limited(10) == b"a"
    assert len(opened) == 2 and opened[0].closed


async def test_a_new_connection_reset_before_any_byte_is_connection_lost() -> None:
    pool, opened = scripted_pool([RESET])
    with pytest.raises(UpstreamProtocolError) as caught:
        await post(pool)
    assert caught.value.message == "up: connection lost ([Errno 104] Connection reset by peer)"
    assert len(opened) == 1


async def test_a_head_that_is_not_http_is_the_provider_s_protocol_error() -> None:
    pool, opened = scripted_pool([b"SSH-2.0-OpenSSH\r\n\r\n"])
    with pytest.raises(UpstreamProtocolError) as caught:
        await post(pool)
    assert caught.value.message.startswith("up: malformed response: ")
    assert caught.value.provider == "up"
    assert opened[0].closed
