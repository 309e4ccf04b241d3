"""The streaming path's HTTP/1.1 client against real sockets: reuse, staleness, failures."""

from __future__ import annotations

import contextlib
import fcntl
import resource
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from trio_gateway.core.errors import UpstreamProtocolError, UpstreamUnreachable
from trio_gateway.http1.client import (
    H1Pool,
    H1Response,
    _readable,
    encode_request,
    split_url,
)

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)

Handler = Callable[[trio.SocketStream, int], Awaitable[None]]


async def read_request(stream: trio.SocketStream) -> bytes:
    """One request (head and content-length body), or b"" when the client closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = await stream.receive_some(65536)
        if not more:
            return b""
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.startswith(b"content-length")
    )
    while len(body) < length:
        body += await stream.receive_some(65536)
    return head


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on a free port; ``handler(stream, n)`` serves its n-th connection. Yields the
    URL and the list of connections accepted so far."""
    accepted: list[int] = []

    async def serve(stream: trio.SocketStream) -> None:
        accepted.append(len(accepted))
        # A client that closes mid-answer is what some tests do: not the server's failure.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await handler(stream, accepted[-1])

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}/v1/chat/completions", accepted
        nursery.cancel_scope.cancel()


def pool() -> H1Pool:
    return H1Pool("up", max_idle=4, idle_expiry_s=60, connect_timeout_s=2, write_timeout_s=2)


async def read_all(response: H1Response) -> bytes:
    out = b""
    while parts := await response.receive():
        out += b"".join(parts)
    return out


async def sse_forever(stream: trio.SocketStream, _: int) -> None:
    """Keep-alive: answers every request on the connection with two events."""
    while await read_request(stream):
        await stream.send_all(SSE_HEAD + chunk(b"data: a\n\n"))
        await stream.send_all(chunk(b"data: b\n\n") + b"0\r\n\r\n")


async def test_a_stream_is_read_and_its_connection_reused() -> None:
    async with server(sse_forever) as (url, accepted):
        client = pool()
        for _ in range(3):
            response = await client.post(url, {"authorization": "Bearer k"}, b"{}")
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            assert await read_all(response) == b"data: a\n\ndata: b\n\n"
            await response.aclose()
            assert client.idle_count() == 1
    assert accepted == [0]


async def test_a_body_not_read_to_its_end_closes_the_connection() -> None:
    async def first_never_ends(stream: trio.SocketStream, n: int) -> None:
        if n > 0:
            await sse_forever(stream, n)
            return
        await read_request(stream)
        await stream.send_all(SSE_HEAD + chunk(b"data: a\n\n"))
        await trio.sleep_forever()

    async with server(first_never_ends) as (url, accepted):
        client = pool()
        response = await client.post(url, {}, b"{}")
        await response.receive()
        await response.aclose()
        assert client.idle_count() == 0
        await read_all(await client.post(url, {}, b"{}"))
    assert accepted == [0, 1]


async def test_connection_close_is_honoured() -> None:
    async def once(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
        )

    async with server(once) as (url, accepted):
        client = pool()
        for _ in range(2):
            response = await client.post(url, {}, b"{}")
            assert await response.read_limited(100) == b"ok"
            await response.aclose()
    assert accepted == [0, 1]


async def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    async def one_then_close(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.send_all(SSE_HEAD + b"0\r\n\r\n")
        await stream.aclose()  # the server's idle timeout, at once

    async with server(one_then_close) as (url, accepted):
        client = pool()
        first = await client.post(url, {}, b"{}")
        assert await read_all(first) == b""
        await first.aclose()
        assert client.idle_count() == 1
        await trio.sleep(0.05)  # the FIN has to arrive: real sockets, no clock to jump
        response = await client.post(url, {}, b"{}")
        assert response.status_code == 200
        await response.aclose()
    assert accepted == [0, 1]


async def test_a_reused_connection_that_fails_before_any_byte_is_replaced_once() -> None:
    """The keep-alive race: the server closes just as the request is written."""

    async def race(stream: trio.SocketStream, n: int) -> None:
        if n > 0:
            await sse_forever(stream, n)
            return
        await read_request(stream)
        await stream.send_all(SSE_HEAD + b"0\r\n\r\n")
        await read_request(stream)  # takes the second request...
        await stream.aclose()  # ...and closes without an answer

    async with server(race) as (url, accepted):
        client = pool()
        first = await client.post(url, {}, b"{}")
        await read_all(first)
        await first.aclose()
        assert client.idle_count() == 1
        response = await client.post(url, {}, b"{}")
        assert await read_all(response) == b"data: a\n\ndata: b\n\n"
        await response.aclose()
    assert accepted == [0, 1]


async def test_a_new_connection_closed_before_an_answer_is_connection_lost() -> None:
    async def hang_up(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.aclose()

    async with server(hang_up) as (url, _):
        with pytest.raises(UpstreamProtocolError, match=r"connection lost \(server disconnected"):
            await pool().post(url, {}, b"{}")


async def test_a_body_cut_mid_chunk_is_connection_lost() -> None:
    async def cut(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.send_all(SSE_HEAD + b"20\r\ndata: only part")
        await stream.aclose()

    async with server(cut) as (url, _):
        response = await pool().post(url, {}, b"{}")
        assert await response.receive() == [b"data: only part"]
        with pytest.raises(UpstreamProtocolError, match="connection lost"):
            await response.receive()
        await response.aclose()


async def test_a_malformed_answer_is_a_protocol_error() -> None:
    async def garbage(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.send_all(b"SSH-2.0-OpenSSH\r\n\r\n")

    async with server(garbage) as (url, _):
        with pytest.raises(UpstreamProtocolError, match=r"up: malformed response: "):
            await pool().post(url, {}, b"{}")


async def test_nobody_listening_is_cannot_connect() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UpstreamUnreachable, match="up: cannot connect"):
        await pool().post(f"http://127.0.0.1:{port}/v1", {}, b"{}")


async def test_a_cancelled_read_closes_the_connection() -> None:
    async def slow(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.send_all(SSE_HEAD + chunk(b"data: a\n\n"))
        await trio.sleep_forever()

    async with server(slow) as (url, _):
        client = pool()
        response = await client.post(url, {}, b"{}")
        await response.receive()
        with trio.move_on_after(0.05):
            await response.receive()
        await response.aclose()
        assert client.idle_count() == 0


def test_the_request_on_the_wire() -> None:
    origin, target, host = split_url("https://api.example.com/v1beta/models/x:stream?alt=sse")
    assert (origin.port, target, host) == (
        443,
        "/v1beta/models/x:stream?alt=sse",
        "api.example.com",
    )
    assert split_url("http://10.0.0.1:8000/v1/chat")[2] == "10.0.0.1:8000"
    wire = encode_request(target, host, {"authorization": "Bearer k", "Host": "evil"}, b"{}")
    assert wire == (
        b"POST /v1beta/models/x:stream?alt=sse HTTP/1.1\r\nhost: api.example.com\r\n"
        b"content-length: 2\r\nauthorization: Bearer k\r\naccept-encoding: identity\r\n\r\n{}"
    )
    # A provider's own choice of coding is left alone (an answer in it is decoded).
    assert b"identity" not in encode_request("/", "h", {"Accept-Encoding": "gzip"}, b"")
    with pytest.raises(ValueError, match="line break"):
        encode_request("/", "h", {"x-id": "a\r\nx-admin: 1"}, b"")


async def test_an_idle_connection_past_descriptor_1024_is_checked_too() -> None:
    """select() refuses descriptors past FD_SETSIZE (1024); a gateway with thousands of streams
    has them, so the staleness check must not use it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard}: this test needs 1,200 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    a, b = socket.socketpair()
    high = fcntl.fcntl(a.fileno(), fcntl.F_DUPFD, 1100)
    a.close()
    try:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=high)))
        assert stream.socket.fileno() >= 1024
        assert not _readable(stream)
        b.close()  # the "server" closes the idle connection
        assert _readable(stream)
        await stream.aclose()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class HeldAnswers:
    """A handler that starts each answer, holds it until ``release`` once ``count`` answers
    are open at once (``all_open``), then ends it: so many requests, so many connections."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.heads = 0
        self.release, self.all_open = trio.Event(), trio.Event()

    async def __call__(self, stream: trio.SocketStream, _: int) -> None:
        while await read_request(stream):
            await stream.send_all(SSE_HEAD + chunk(b"data: a\n\n"))
            self.heads += 1
            if self.heads == self.count:
                self.all_open.set()
            await self.release.wait()
            await stream.send_all(b"0\r\n\r\n")


async def test_idle_connections_are_bounded_when_many_end_at_once() -> None:
    """Ten streams at once, each on its own connection: when they all end, at most max_idle
    (4) stay open; the rest are closed, and the next requests reuse the kept ones."""
    held = HeldAnswers(10)
    async with server(held) as (url, accepted):
        client = pool()
        ended = 0

        async def one() -> None:
            nonlocal ended
            response = await client.post(url, {}, b"{}")
            await read_all(response)
            await response.aclose()
            ended += 1

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(one)
            await held.all_open.wait()  # ten answers open at once, on ten connections
            held.release.set()
        assert ended == 10 and len(accepted) == 10
        assert client.idle_count() == 4
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(one)
        assert len(accepted) == 10 and client.idle_count() == 4


async def test_an_abort_reaches_the_server_with_no_read_of_the_client_task() -> None:
    saw_end = trio.Event()

    async def answer_then_listen(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.send_all(SSE_HEAD + chunk(b"data: a\n\n"))
        assert await stream.receive_some(10) == b""
        saw_end.set()

    async with server(answer_then_listen) as (url, _):
        client = pool()
        response = await client.post(url, {}, b"{}")
        await response.receive()
        response.abort()  # from outside: the reading task does nothing more before the end
        with trio.fail_after(5):
            await saw_end.wait()
        await response.aclose()
        assert client.idle_count() == 0


async def test_an_aborted_connection_is_not_reused_even_after_a_whole_body() -> None:
    async with server(sse_forever) as (url, accepted):
        client = pool()
        response = await client.post(url, {}, b"{}")
        await read_all(response)
        response.abort()
        await response.aclose()
        assert client.idle_count() == 0
        await read_all(await client.post(url, {}, b"{}"))
    assert accepted == [0, 1]


READ_FAST_BYTES = 32 * 1024 * 1024


async def test_an_answer_not_read_backs_up_to_its_upstream_within_a_bound() -> None:
    """A stream the gateway does not read (its client is slow) stops its upstream's writes
    after a bounded amount, as a slow client of the upstream's own would: the kernel's receive
    buffer is not left to grow to tcp_rmem's maximum (tens of MiB) per stalled answer."""
    sent = 0
    blocked = trio.Event()

    async def flood(stream: trio.SocketStream, _: int) -> None:
        nonlocal sent
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        await read_request(stream)
        await stream.send_all(SSE_HEAD)
        piece = chunk(b"data: " + b"x" * 16000 + b"\n\n")
        while True:
            # Blocked for a second on loopback: the reader's buffer is full.
            with trio.move_on_after(1.0) as late:
                await stream.send_all(piece)
            if late.cancelled_caught:
                blocked.set()
                await trio.sleep_forever()
            sent += len(piece)

    async with server(flood) as (url, _):
        response = await pool().post(url, {}, b"{}")
        # Read fast first, as the gateway does while its client keeps up: the kernel grows a
        # buffer that is read fast (autotuning), then the client stalls.
        read = 0
        while read < READ_FAST_BYTES:
            read += sum(map(len, await response.receive()))
        start = sent
        with trio.fail_after(30):
            await blocked.wait()
        await response.aclose()
    # 64 KB here (the server's own send buffer is half of it); 945 KB with the kernel's
    # autotuning, which would grow it further with a longer fast read.
    assert sent - start < 256 * 1024, f"the upstream wrote {sent - start} bytes nobody read"


HELD_BACK_PIECES = 256  # 4 MB of events


async def test_an_answer_held_back_comes_at_full_speed_once_read_again() -> None:
    """An answer the gateway stops reading (its client is slow) flows again at loopback speed
    once read: the small receive buffer is set before the handshake, so the sender never sizes
    its segments for a window larger than the one it is later offered. Set after it, the
    sender's queued segments waited for window probes and 4 MB took tens of seconds."""
    blocked = trio.Event()
    event = b"data: " + b"x" * 16000 + b"\n\n"
    piece = chunk(event)

    async def flood(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.send_all(SSE_HEAD)
        for _ in range(HELD_BACK_PIECES):
            rest = memoryview(piece)
            while rest:
                # A send cancelled while it waits for room has sent nothing.
                with trio.move_on_after(0.2) as late:
                    rest = rest[await stream.socket.send(rest) :]
                if late.cancelled_caught:
                    blocked.set()
        await stream.send_all(b"0\r\n\r\n")

    async with server(flood) as (url, _):
        response = await pool().post(url, {}, b"{}")
        with trio.fail_after(10):
            await blocked.wait()  # the gateway read nothing: the upstream's writes wait
        received = 0
        with trio.fail_after(10):  # at loopback speed well under a second
            while parts := await response.receive():
                received += sum(map(len, parts))
    assert received == HELD_BACK_PIECES * len(event)


async def test_expiry_closes_every_idle_connection_of_every_origin_and_counts_them() -> None:
    """Two idle connections on each of two origins, all past their expiry: all four closed,
    counted across origins."""
    held = HeldAnswers(4)  # counted across both servers
    async with server(held) as (url_a, _), server(held) as (url_b, _):
        client = H1Pool("up", max_idle=4, idle_expiry_s=0, connect_timeout_s=2, write_timeout_s=2)

        async def one(url: str) -> None:
            response = await client.post(url, {}, b"{}")
            await read_all(response)
            await response.aclose()

        async with trio.open_nursery() as nursery:
            for url in (url_a, url_a, url_b, url_b):
                nursery.start_soon(one, url)
            await held.all_open.wait()  # four answers open at once: four connections
            held.release.set()
        assert client.idle_count() == 4
        assert client.close_expired() == 4
        assert client.idle_count() == 0


async def test_an_exchange_waiting_for_its_head_can_be_aborted_from_outside() -> None:
    """Before its head comes (vLLM queueing the request, or generating a whole answer), the
    exchange can be ended from outside the task waiting for it: the server reads the end at
    once, not when that task gets its turn (a busy loop's)."""
    saw_end = trio.Event()

    async def listen(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        assert await stream.receive_some(10) == b""
        saw_end.set()

    async with server(listen) as (url, _):
        client = pool()
        aborts: list[Callable[[], None]] = []
        lost: list[UpstreamProtocolError] = []

        async def ask() -> None:
            try:
                await client.post(url, {}, b"{}", on_sending=aborts.append)
            except UpstreamProtocolError as exc:
                lost.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            with trio.fail_after(5):
                while not aborts:  # noqa: ASYNC110 - the hook is a plain call
                    await trio.sleep(0.01)
                aborts[0]()
                await saw_end.wait()
        assert len(lost) == 1  # the exchange's own task found it over, when it ran
        assert client.idle_count() == 0
