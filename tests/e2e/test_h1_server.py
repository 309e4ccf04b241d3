"""The gateway's HTTP/1.x server on real sockets, with small ASGI apps and raw clients: what a
client gets for each way of talking HTTP/1.x (keep-alive, pipelining, chunked bodies, Expect,
HTTP/1.0), for each mistake it can make, and when the connection ends."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from tests.sockets import connected_pair
from trio_gateway.http1 import hang_ups as h1_hang_ups
from trio_gateway.http1.hang_ups import TICKS_PER_POLL, HangUps
from trio_gateway.http1.server import HANG_UP_EXTENSION, H1Server

Message = dict[str, Any]


async def echo(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body; answers what it saw, sized."""
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message["body"]
        if not message["more_body"]:
            break
    answer = json.dumps(
        {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode(),
            "version": scope["http_version"],
            "body": body.decode(),
            "client": list(scope["client"]),
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(answer)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": answer})


async def stream3(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for part in (b"one", b"two", b"three"):
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def unread(scope: Any, receive: Any, send: Any) -> None:
    """Answers at once, without reading the body (as a refusal does)."""
    body = b'{"error": "no"}'
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def broken(scope: Any, receive: Any, send: Any) -> None:
    raise KeyError("boom")


async def refuse_hand_off(stream: trio.abc.Stream) -> None:
    raise AssertionError("nothing here is for hypercorn")


@asynccontextmanager
async def serving(
    app: Any,
    *,
    keep_alive_timeout_s: float = 5.0,
    head_timeout_s: float = 5.0,
    body_timeout_s: float = 5.0,
    max_body_bytes: int = 1 << 20,
    hand_off: Any = refuse_hand_off,
    fds: dict[Any, int] | None = None,
) -> AsyncIterator[tuple[H1Server, int]]:
    """``fds``, when given, gets each connection's descriptor by its client address (what the
    gateway's app finds through ``listen.Connections``)."""
    server = H1Server(
        app,
        hand_off,
        keep_alive_timeout_s=keep_alive_timeout_s,
        head_timeout_s=head_timeout_s,
        body_timeout_s=body_timeout_s,
        write_timeout_s=5.0,
        max_body_bytes=max_body_bytes,
    )

    async def serve(stream: trio.SocketStream) -> None:
        if fds is not None:
            fds[tuple(stream.socket.getpeername())] = stream.socket.fileno()
        await server.serve(stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(server.hang_ups.serve)
        listeners = await nursery.start(trio.serve_tcp, serve, 0)
        yield server, listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


class Client:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""
        self.answered_at = 0.0

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read_until(self, marker: bytes) -> bytes:
        with trio.fail_after(5):
            while marker not in self.buffer:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError(self.buffer)
                self.buffer += data
        out, _, self.buffer = self.buffer.partition(marker)
        return out + marker

    async def response(self) -> tuple[bytes, dict[bytes, bytes], bytes]:
        """A sized response: its status line, headers, body."""
        head = await self.read_until(b"\r\n\r\n")
        status, *lines = head[:-4].split(b"\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in lines)
        length = int(headers.get(b"content-length", b"0"))
        with trio.fail_after(5):
            while len(self.buffer) < length:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError(self.buffer)
                self.buffer += data
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, headers, body

    async def closed(self) -> bool:
        """True once the server closed its side (after anything still to read)."""
        with trio.fail_after(5):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return True
                if not data:
                    return True
                self.buffer += data


@asynccontextmanager
async def client(port: int) -> AsyncIterator[Client]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        yield Client(stream)


def post(path: str, body: bytes, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gw", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def test_keep_alive_serves_requests_one_after_another_on_one_connection() -> None:
    async with serving(echo) as (_, port), client(port) as c:
        for i in range(3):
            await c.send(post(f"/v1/x?i={i}", b"hello %d" % i))
            status, headers, body = await c.response()
            assert status == b"HTTP/1.1 200 OK"
            assert b"date" in headers and b"connection" not in headers
            seen = json.loads(body)
            assert (seen["path"], seen["query"], seen["body"]) == ("/v1/x", f"i={i}", f"hello {i}")
            assert seen["method"] == "POST" and seen["version"] == "1.1"


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with serving(echo) as (_, port), client(port) as c:
        await c.send(post("/a", b"1") + post("/b", b"22") + post("/c", b"333"))
        bodies = [json.loads((await c.response())[2])["body"] for _ in range(3)]
        assert bodies == ["1", "22", "333"]


async def test_a_chunked_request_body_is_read_whole() -> None:
    async with serving(echo) as (_, port), client(port) as c:
        head = "POST /x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n"
        await c.send(head.encode() + b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\n")
        assert json.loads((await c.response())[2])["body"] == "hello world"
        await c.send(post("/next", b"after"))  # the connection goes on after a chunked body
        assert json.loads((await c.response())[2])["body"] == "after"


async def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    async with serving(echo) as (_, port), client(port) as c:
        await c.send(
            b"POST /x HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n"
        )
        assert await c.read_until(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        await c.send(b"body")
        assert json.loads((await c.response())[2])["body"] == "body"


async def test_an_answer_without_a_length_is_chunked_on_http11() -> None:
    async with serving(stream3) as (_, port), client(port) as c:
        await c.send(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
        head = await c.read_until(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head
        body = await c.read_until(b"0\r\n\r\n")
        assert body == b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n0\r\n\r\n"
        await c.send(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")  # and the connection is kept
        assert b"200 OK" in await c.read_until(b"\r\n\r\n")


async def test_http10_is_answered_and_closed_unless_it_asks_to_keep_alive() -> None:
    async with serving(stream3) as (_, port), client(port) as c:
        await c.send(b"GET / HTTP/1.0\r\n\r\n")  # no Host needed
        head = await c.read_until(b"\r\n\r\n")
        assert b"connection: close" in head and b"transfer-encoding" not in head
        assert await c.closed()
        assert c.buffer == b"onetwothree"  # the body ends with the connection
    async with serving(echo) as (_, port), client(port) as c:
        for _ in range(2):
            await c.send(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            _status, headers, body = await c.response()
            assert headers[b"connection"] == b"keep-alive"
            assert json.loads(body)["version"] == "1.0"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\n\r\n", b"400"),  # no Host
        (b"GET / HTTP/2.0\r\nHost: gw\r\n\r\n", b"505"),
        (
            b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            b"400",
        ),
        (b"POST / HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip\r\n\r\n", b"400"),
        (b"POST / HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", b"501"),
        (b"GET / HTTP/1.1\r\nHost: gw\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
        (b"GET / HTTP/1.1\r\nHost: gw\r\nX: " + b"a" * 70_000, b"431"),  # never ends
    ],
)
async def test_a_request_the_server_refuses_gets_its_status_as_json_and_the_end(
    request_bytes: bytes, status: bytes
) -> None:
    async with serving(echo) as (_, port), client(port) as c:
        await c.send(request_bytes)
        line, headers, body = await c.response()
        assert line.split(b" ")[1] == status
        error = json.loads(body)["error"]
        assert error["code"] == "malformed_http" and error["message"]
        assert headers[b"connection"] == b"close"
        assert await c.closed()


async def test_a_bad_chunk_in_a_body_is_a_400_and_the_end() -> None:
    async with serving(echo) as (_, port), client(port) as c:
        await c.send(b"POST /x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        line, headers, body = await c.response()
        assert line.startswith(b"HTTP/1.1 400")
        assert headers[b"connection"] == b"close"
        assert json.loads(body)["error"]["code"] == "malformed_http"
        assert await c.closed()


async def test_an_app_that_fails_is_a_500_and_the_end() -> None:
    async with serving(broken) as (_, port), client(port) as c:
        await c.send(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
        line, _, body = await c.response()
        assert line.startswith(b"HTTP/1.1 500")
        assert json.loads(body)["error"]["message"] == "internal error"
        assert await c.closed()


async def test_head_requests_get_the_head_only() -> None:
    async with serving(unread) as (_, port), client(port) as c:
        await c.send(b"HEAD / HTTP/1.1\r\nHost: gw\r\n\r\n")
        head = await c.read_until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 404") and b"content-length: 15" in head
        await c.send(b"HEAD / HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert (await c.read_until(b"\r\n\r\n")).startswith(b"HTTP/1.1 404")  # no body between


async def test_an_answer_to_a_body_nobody_read_still_reaches_the_client() -> None:
    # The server closes (the body was not read), gently: a reset would destroy the answer.
    async with serving(unread) as (_, port), client(port) as c:
        await c.send(post("/nowhere", b"x" * 500_000))
        line, _headers, body = await c.response()
        assert line.startswith(b"HTTP/1.1 404") and body == b'{"error": "no"}'
        assert await c.closed()


async def test_a_client_silent_mid_head_gets_a_408_at_the_head_timeout() -> None:
    async with serving(echo, head_timeout_s=0.3) as (_, port):
        # Before the connection: the first head's deadline runs from its accept.
        started = trio.current_time()
        async with client(port) as c:
            await c.send(b"GET / HTTP/1.1\r\nHo")
            line, headers, body = await c.response()
            assert 0.3 <= trio.current_time() - started < 2.0
            assert line.startswith(b"HTTP/1.1 408")
            assert headers[b"connection"] == b"close"
            assert json.loads(body)["error"]["code"] == "request_timeout"
            assert await c.closed()


async def test_an_idle_keep_alive_connection_is_closed_at_its_timeout() -> None:
    async with serving(echo, keep_alive_timeout_s=0.3) as (_, port), client(port) as c:
        await c.send(post("/x", b"1"))
        await c.response()
        assert await c.closed()


async def test_terminate_closes_idle_connections_and_ends_busy_ones_after_their_answer() -> None:
    release = trio.Event()

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await release.wait()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})

    async with serving(slow) as (server, port), client(port) as idle, client(port) as busy:
        await busy.send(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()
        server.terminate()
        assert await idle.closed()
        release.set()
        _, headers, body = await busy.response()
        assert body == b"ok" and headers[b"connection"] == b"close"
        assert await busy.closed()


async def test_receive_says_disconnect_when_the_client_leaves_or_the_answer_is_sent() -> None:
    seen: list[tuple[str, bool]] = []
    left = trio.Event()

    async def watcher(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the (empty) body
        if scope["path"] == "/leave":
            message = await receive()
            seen.append((message["type"], False))
            left.set()
            return
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
        )
        async with trio.open_nursery() as nursery:

            async def wait() -> None:
                seen.append(((await receive())["type"], True))

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            await send({"type": "http.response.body", "body": b""})

    async with serving(watcher) as (_, port):
        async with client(port) as c:
            await c.send(b"GET /done HTTP/1.1\r\nHost: gw\r\n\r\n")
            await c.response()
        async with client(port) as c:
            await c.send(b"GET /leave HTTP/1.1\r\nHost: gw\r\n\r\n")
            await trio.testing.wait_all_tasks_blocked()
            linger = struct.pack("ii", 1, 0)
            c.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        with trio.fail_after(5):
            await left.wait()
    assert seen == [("http.disconnect", True), ("http.disconnect", False)]


async def test_an_upgrade_is_handed_on_with_every_byte_read() -> None:
    got: list[bytes] = []

    async def hand_off(stream: trio.abc.Stream) -> None:
        data = b""
        while b"tail" not in data:
            data += await stream.receive_some(65536)
        got.append(data)
        await stream.send_all(b"handed")

    upgrade = (
        b"GET /v1/ws HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    )
    async with serving(echo, hand_off=hand_off) as (_, port), client(port) as c:
        await c.send(post("/first", b"1"))
        await c.response()  # a request first: the upgrade comes on a kept connection
        await c.send(upgrade + b"tail")
        assert await c.read_until(b"handed") == b"handed"
    assert got == [upgrade + b"tail"]


async def test_http2_prior_knowledge_is_handed_on() -> None:
    got: list[bytes] = []

    async def hand_off(stream: trio.abc.Stream) -> None:
        got.append(bytes(await stream.receive_some(65536)))

    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    async with serving(echo, hand_off=hand_off) as (_, port), client(port) as c:
        await c.send(preface + b"\x00\x00")
        assert await c.closed()
    assert got == [preface + b"\x00\x00"]


async def test_a_failure_of_the_server_itself_ends_that_connection_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from trio_gateway.http1.request import RequestParser

    real = RequestParser.head

    def parse(self: RequestParser, block: bytes) -> Any:
        if b"/boom" in block:
            raise ValueError("a bug")
        return real(self, block)

    monkeypatch.setattr(RequestParser, "head", parse)
    async with serving(echo) as (_, port):
        async with client(port) as c:
            await c.send(b"GET /boom HTTP/1.1\r\nHost: gw\r\n\r\n")
            assert await c.closed()
        async with client(port) as c:  # the listener and the next connection go on
            await c.send(post("/fine", b"ok"))
            assert json.loads((await c.response())[2])["body"] == "ok"
    assert "HTTP/1.x connection failed" in caplog.text


async def test_the_hang_up_watch_tells_of_a_client_that_left_once_and_not_after_it_ended() -> None:
    told: list[str] = []
    left = trio.Event()
    fds: dict[Any, int] = {}

    def gone(path: str) -> None:
        told.append(path)
        left.set()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        hang_ups = scope["extensions"][HANG_UP_EXTENSION]
        fd = fds[tuple(scope["client"])]
        callback = partial(gone, scope["path"])
        hang_ups.watch(fd, callback)
        if scope["path"] == "/stay":
            hang_ups.unwatch(fd, callback)  # the answer ended first: nobody's business later
        await trio.sleep_forever()

    async with serving(app, fds=fds) as (server, port):
        async with client(port) as c:
            await c.send(b"GET /stay HTTP/1.1\r\nHost: gw\r\n\r\n")
            await trio.testing.wait_all_tasks_blocked()
            assert len(server.hang_ups) == 0
        await trio.testing.wait_all_tasks_blocked()
        assert told == []
        async with client(port) as c:
            await c.send(b"GET /leave HTTP/1.1\r\nHost: gw\r\n\r\n")
            await trio.testing.wait_all_tasks_blocked()
            assert len(server.hang_ups) == 1
        with trio.fail_after(5):
            await left.wait()
        assert len(server.hang_ups) == 0
    assert told == ["/leave"]


async def test_a_watch_of_a_reused_descriptor_is_not_undone_by_the_old_unwatch() -> None:
    hang_ups = HangUps()
    told: list[str] = []
    left = trio.Event()

    def gone(which: str) -> None:
        told.append(which)
        left.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(hang_ups.serve)
        peer, server_side = await connected_pair()
        fd = server_side.socket.fileno()
        old = partial(gone, "old")
        hang_ups.watch(fd, old)
        hang_ups.watch(fd, partial(gone, "new"))  # the same descriptor, watched anew
        hang_ups.unwatch(fd, old)
        assert len(hang_ups) == 1
        await peer.aclose()
        with trio.fail_after(5):
            await left.wait()
        assert told == ["new"]
        await server_side.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("per_poll", [1024, 7])
async def test_many_clients_hanging_up_at_once_are_each_told_once(
    per_poll: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """60 hang-ups at once, also past what one look at the set takes (then the next look
    takes the rest)."""
    monkeypatch.setattr(h1_hang_ups, "MAX_HANG_UPS_PER_POLL", per_poll)
    clients = 60
    told: list[int] = []
    all_told = trio.Event()
    watching = 0
    all_watching = trio.Event()
    fds: dict[Any, int] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal watching
        port = scope["client"][1]

        def gone() -> None:
            told.append(port)
            if len(told) == clients:
                all_told.set()

        scope["extensions"][HANG_UP_EXTENSION].watch(fds[tuple(scope["client"])], gone)
        watching += 1
        if watching == clients:
            all_watching.set()
        await trio.sleep_forever()

    async with serving(app, fds=fds) as (server, port):
        streams = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(clients)]
        for stream in streams:
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
        with trio.fail_after(5):
            await all_watching.wait()
        assert len(server.hang_ups) == clients
        for stream in streams:  # all at once, between two looks of the watch
            stream.socket.close()
        with trio.fail_after(5):
            await all_told.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert len(told) == len(set(told)) == clients  # each told, and only once
        assert len(server.hang_ups) == 0


async def test_work_in_one_long_turn_looks_at_the_hang_ups_itself() -> None:
    """A burst of chunks is one turn of trio's loop, in which the serve task cannot run: the
    writers' ticks find the hang-up, with no checkpoint between the close and the callback."""
    hang_ups = HangUps()
    told: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(hang_ups.serve)
        peer, server_side = await connected_pair()
        hang_ups.watch(server_side.socket.fileno(), partial(told.append, "gone"))
        peer.socket.close()  # the FIN is in the kernel's hands at once, on loopback
        for _ in range(TICKS_PER_POLL - 1):
            hang_ups.tick()
        assert told == []  # a look only every TICKS_PER_POLL ticks
        hang_ups.tick()
        assert told == ["gone"]
        assert len(hang_ups) == 0
        await server_side.aclose()
        nursery.cancel_scope.cancel()


async def test_a_watch_of_a_socket_closed_already_tells_at_once() -> None:
    hang_ups = HangUps()
    told: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(hang_ups.serve)
        hang_ups.watch(-1, partial(told.append, "gone"))  # what fileno() says once closed
        assert told == ["gone"]
        assert len(hang_ups) == 0
        nursery.cancel_scope.cancel()
