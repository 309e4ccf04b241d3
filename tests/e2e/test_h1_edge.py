"""The HTTP/1.x edge's rules (issue 26), each with the raw bytes on a real socket: what the server
refuses, with which status, that nothing after a refusal is run (no request smuggled behind it),
the deadlines, and ``connection: close`` on every answer after which the server closes.

Each refusal is followed in the same write by a second, valid request: a server that frames the
first one differently from a strict parser answers two (the smuggling of issue 26)."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

import pytest
import trio

from tests.e2e.harness import Stack, gateway_config, provider_toml, running_gateway, running_sim
from tests.e2e.test_h1_server import Client, client, echo, post, serving, unread

NEXT = b"GET /smuggled HTTP/1.1\r\nHost: gw\r\n\r\n"
CHUNKED = b"POST /x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunked(body: bytes) -> bytes:
    return CHUNKED + body


async def refused_alone(c: Client, status: bytes, code: str = "malformed_http") -> bytes:
    """One error answer, then the end: nothing sent after the refused request is answered.
    ``c.answered_at``: when the answer came."""
    line, headers, body = await c.response()
    c.answered_at = trio.current_time()
    assert line.split(b" ")[1] == status, line
    assert headers[b"connection"] == b"close"
    error = json.loads(body)["error"]
    assert error["code"] == code
    assert await c.closed()
    assert b"HTTP/1.1" not in c.buffer  # no second answer
    return bytes(error["message"].encode())


REFUSED = [
    # Framing that two parsers could read two ways.
    ("content-length with transfer-encoding", CHUNKED[:-2] + b"Content-Length: 5\r\n\r\n0\r\n\r\n"),
    ("two content-lengths", post("/x", b"hello", "Content-Length: 5")),
    ("conflicting content-lengths", post("/x", b"hello", "Content-Length: 7")),
    ("a content-length list", post("/x", b"hello").replace(b"Length: 5", b"Length: 5, 5")),
    ("content-length with a plus", post("/x", b"hello").replace(b"Length: 5", b"Length: +5")),
    ("content-length with an underscore", post("/x", b"0123456789abcdef").replace(b"16", b"1_6")),
    ("content-length in hex", post("/x", b"hello").replace(b"Length: 5", b"Length: 0x5")),
    ("content-length of 20 digits", post("/x", b"hello").replace(b": 5", b": " + b"0" * 19 + b"5")),
    ("content-length of 25 digits", post("/x", b"").replace(b": 0", b": " + b"9" * 25)),
    ("content-length of 5000 digits", post("/x", b"").replace(b": 0", b": " + b"1" * 5000)),
    ("content-length of a superscript", post("/x", b"").replace(b": 0", ": ²".encode())),
    ("chunk size 1_0", chunked(b"1_0\r\n0123456789abcdef\r\n0\r\n\r\n")),
    ("chunk size with a form feed", chunked(b"\x0c5\r\nhello\r\n0\r\n\r\n")),
    ("chunk size with a plus", chunked(b"+5\r\nhello\r\n0\r\n\r\n")),
    ("chunk size in 0x", chunked(b"0x5\r\nhello\r\n0\r\n\r\n")),
    ("chunk size then a space", chunked(b"5 \r\nhello\r\n0\r\n\r\n")),
    ("chunk size then a tab", chunked(b"5\t\r\nhello\r\n0\r\n\r\n")),
    ("chunk size line ending CR CR LF", chunked(b"5\r\r\nhello\r\n0\r\n\r\n")),
    ("chunk size of 17 hex digits", chunked(b"0" * 16 + b"5\r\nhello\r\n0\r\n\r\n")),
    ("chunk size of 25 hex digits", chunked(b"0" * 24 + b"5\r\nhello\r\n0\r\n\r\n")),
    ("chunk lines ending in a bare LF", chunked(b"5\nhello\n0\n\n")),
    ("chunk data ending in a bare LF", chunked(b"5\r\nhello\n0\r\n\r\n")),
    ("chunk data ending in a bare CR", chunked(b"5\r\nhello\r0\r\n\r\n")),
    ("chunk data longer than its size", chunked(b"5\r\nhelloX\r\n0\r\n\r\n")),
    ("the last chunk ending in a bare LF", chunked(b"5\r\nhello\r\n0\n\r\n")),
    ("a request line in the trailers", chunked(b"0\r\n") + NEXT),
    ("a trailer line that is not a field", chunked(b"0\r\nnot a field\r\n\r\n")),
    ("a trailer with a NUL", chunked(b"0\r\nX-T: a\x00b\r\n\r\n")),
    ("a folded trailer", chunked(b"0\r\nX-T: a\r\n b\r\n\r\n")),
    ("transfer-encoding chunked,", CHUNKED.replace(b"chunked", b"chunked,") + b"0\r\n\r\n"),
    ("transfer-encoding twice", CHUNKED[:-2] + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("transfer-encoding on HTTP/1.0", CHUNKED.replace(b"1.1", b"1.0") + b"0\r\n\r\n"),
    ("an obs-fold", b"GET / HTTP/1.1\r\nHost: gw\r\nX: a\r\n b\r\n\r\n"),
    ("a space before a colon", b"GET / HTTP/1.1\r\nHost: gw\r\nX : a\r\n\r\n"),
    ("a bare LF in the head", b"GET / HTTP/1.1\nHost: gw\n\n"),
    ("a bare CR in the head", b"GET / HTTP/1.1\r\nHost: gw\rX: a\r\n\r\n"),
    ("a NUL in a header", b"GET / HTTP/1.1\r\nHost: gw\r\nX: a\x00b\r\n\r\n"),
    ("two spaces in the request line", b"GET  / HTTP/1.1\r\nHost: gw\r\n\r\n"),
    ("a blank line before the request", b"\r\nGET / HTTP/1.1\r\nHost: gw\r\n\r\n"),
    ("two hosts", b"GET / HTTP/1.1\r\nHost: gw\r\nHost: other\r\n\r\n"),
    ("CONNECT", b"CONNECT gw:443 HTTP/1.1\r\nHost: gw:443\r\n\r\n"),
]


@pytest.mark.parametrize(("name", "request_bytes"), REFUSED, ids=[name for name, _ in REFUSED])
async def test_a_malformed_request_is_a_400_and_nothing_after_it_runs(
    name: str, request_bytes: bytes
) -> None:
    async with serving(echo) as (_, port), client(port) as c:
        await c.send(request_bytes + NEXT)
        await refused_alone(c, b"400")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (CHUNKED.replace(b"chunked", b"gzip, chunked") + b"0\r\n\r\n", b"501"),
        (CHUNKED.replace(b"chunked", b"identity") + b"0\r\n\r\n", b"400"),  # RFC 9112 6.3
        (b"BREW /pot HTTP/1.1\r\nHost: gw\r\n\r\n", b"501"),
        (b"GET / HTTP/1.2\r\nHost: gw\r\n\r\n", b"505"),
        (b"GET / HTTP/2.0\r\nHost: gw\r\n\r\n", b"505"),
        (b"GET / HTTP/1.1\r\nHost: gw\r\n" + b"X: y\r\n" * 300 + b"\r\n", b"431"),
    ],
)
async def test_refusals_other_than_400_say_what_is_wrong(
    request_bytes: bytes, status: bytes
) -> None:
    async with serving(echo) as (_, port), client(port) as c:
        await c.send(request_bytes + NEXT)
        await refused_alone(c, status)


async def test_trailers_past_the_head_s_bound_are_refused() -> None:
    async with serving(echo) as (_, port), client(port) as c:
        with trio.move_on_after(5), contextlib.suppress(trio.BrokenResourceError):
            # The server refuses before the whole 200 KB is read: stop writing once it has.
            await c.send(chunked(b"0\r\n" + b"X-T: " + b"a" * 100 + b"\r\n") * 1)
            for _ in range(2000):
                await c.send(b"X-T: " + b"a" * 100 + b"\r\n")
        await refused_alone(c, b"431")


async def test_a_declared_body_over_the_limit_is_refused_from_the_head_without_100_continue() -> (
    None
):
    async with serving(echo, max_body_bytes=1000) as (_, port), client(port) as c:
        started = trio.current_time()
        await c.send(
            b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000000000\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        message = await refused_alone(c, b"413", "body_too_large")
        assert b"1000000000" in message
        assert trio.current_time() - started < 2  # at once, not at a deadline
        assert b"100 Continue" not in c.buffer


async def test_a_chunked_body_that_grows_past_the_limit_is_a_413() -> None:
    async with serving(echo, max_body_bytes=1000) as (_, port), client(port) as c:
        await c.send(chunked(b"200\r\n" + b"a" * 512 + b"\r\n") * 1 + b"400\r\n" + b"b" * 1024)
        await refused_alone(c, b"413", "body_too_large")


async def trickle(c: Client, data: bytes, every_s: float) -> None:
    with contextlib.suppress(trio.BrokenResourceError):
        for byte in data:
            await c.send(bytes([byte]))
            await trio.sleep(every_s)


async def test_a_head_trickled_in_is_a_408_at_the_head_deadline() -> None:
    async with serving(echo, head_timeout_s=0.5) as (_, port):
        # Before the connection: the first head's deadline runs from its accept.
        started = trio.current_time()
        async with client(port) as c, trio.open_nursery() as nursery:
            nursery.start_soon(trickle, c, b"GET / HTTP/1.1\r\nHost: gw\r\nX: " + b"a" * 99, 0.05)
            await refused_alone(c, b"408", "request_timeout")
            nursery.cancel_scope.cancel()
        assert 0.5 <= c.answered_at - started < 1.5


async def test_a_connection_that_sends_nothing_is_closed_at_the_head_deadline() -> None:
    async with serving(echo, head_timeout_s=0.3, keep_alive_timeout_s=60) as (_, port):
        # Before the connection: the first head's deadline runs from its accept.
        started = trio.current_time()
        async with client(port) as c:
            assert await c.closed()
            assert 0.3 <= trio.current_time() - started < 2 and c.buffer == b""


async def test_a_kept_alive_connection_may_idle_longer_than_a_head_may_take() -> None:
    async with (
        serving(echo, head_timeout_s=0.4, keep_alive_timeout_s=1.0) as (_, port),
        client(port) as c,
    ):
        await c.send(post("/a", b"1"))
        await c.response()
        await trio.sleep(0.6)  # longer than a head may take, shorter than idling may
        await c.send(post("/b", b"2"))
        assert json.loads((await c.response())[2])["body"] == "2"
        idle_from = trio.current_time()
        assert await c.closed()
        assert 1.0 <= trio.current_time() - idle_from < 3


async def test_a_body_trickled_in_is_a_408_at_the_body_deadline() -> None:
    async with serving(echo, body_timeout_s=0.5) as (_, port), client(port) as c:
        started = trio.current_time()
        await c.send(b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000\r\n\r\n")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle, c, b"a" * 1000, 0.05)
            await refused_alone(c, b"408", "request_timeout")
            nursery.cancel_scope.cancel()
        assert 0.5 <= c.answered_at - started < 1.5


async def test_an_answer_given_before_the_body_was_read_says_the_connection_closes() -> None:
    async with serving(unread) as (_, port), client(port) as c:
        await c.send(post("/x", b"x" * 100))
        line, headers, _ = await c.response()
        assert line.startswith(b"HTTP/1.1 404") and headers[b"connection"] == b"close"
        assert await c.closed()


async def test_a_request_split_at_every_byte_is_served() -> None:
    wire = chunked(b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n") + post("/n", b"ok")
    async with serving(echo) as (_, port), client(port) as c:
        for byte in wire:
            await c.send(bytes([byte]))
        assert json.loads((await c.response())[2])["body"] == "hello world"
        assert json.loads((await c.response())[2])["body"] == "ok"


async def test_a_malformed_request_is_logged_at_debug_with_its_peer_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG", logger="trio_gateway")
    async with serving(echo) as (_, port), client(port) as c:
        await c.send(post("/x", b"").replace(b": 0", b": " + b"1" * 5000))
        await refused_alone(c, b"400")
        peer = c.stream.socket.getsockname()
    assert f"refused a request from 127.0.0.1:{peer[1]} with 400" in caplog.text
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)


# --- through the gateway: what its app and its access log make of it -------------------------


async def gateway_client(stack: Stack) -> trio.SocketStream:
    host, port = stack.gateway.base_url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [dict(r.__dict__["access"]) for r in caplog.records if r.name == "trio_gateway.access"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"zz\r\n", b"400", "malformed_http"),
        (b"5\nhello\n0\n\n", b"400", "malformed_http"),
        (b"0" * 30 + b"5\r\nhello\r\n0\r\n\r\n", b"400", "malformed_http"),
    ],
)
async def test_the_gateway_answers_a_malformed_body_and_logs_malformed_http(
    stack: Stack, caplog: pytest.LogCaptureFixture, body: bytes, status: bytes, code: str
) -> None:
    caplog.set_level(logging.INFO, logger="trio_gateway.access")
    head = CHUNKED.replace(b"/x", b"/v1/chat/completions")
    async with await gateway_client(stack) as stream:
        c = Client(stream)
        await c.send(head + body + NEXT)
        assert await refused_alone(c, status, code)
    [line] = [a for a in access_lines(caplog) if a["route"] == "POST /v1/chat/completions"]
    assert (line["status"], line["code"]) == (int(status), code)
    assert not any(r.exc_info for r in caplog.records)


async def test_the_gateway_times_out_a_slow_body_as_request_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trio_gateway.access")
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n"
    async with running_sim() as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url), "body_timeout_s = 0.5")
        async with running_gateway(config) as gateway:
            stack = Stack(sim=sim, gateway=gateway)
            async with await gateway_client(stack) as stream:
                c = Client(stream)
                started = trio.current_time()
                await c.send(head + b"{")  # then nothing: a client stuck mid-body
                await refused_alone(c, b"408", "request_timeout")
                assert 0.5 <= c.answered_at - started < 1.5
    [line] = [a for a in access_lines(caplog) if a["route"] == "POST /v1/chat/completions"]
    assert (line["status"], line["code"]) == (408, "request_timeout")


async def test_a_head_the_gateway_refuses_has_its_access_line_and_count(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_gateway")
    async with await gateway_client(stack) as stream:
        c = Client(stream)
        await c.send(post("/v1/chat/completions", b"").replace(b": 0", b": " + b"1" * 5000))
        await refused_alone(c, b"400")
    [line] = access_lines(caplog)
    assert (line["route"], line["status"], line["code"]) == ("-", 400, "malformed_http")
    assert not any(r.exc_info for r in caplog.records)
    metrics = stack.gateway.router.metrics.render().decode()
    assert 'gateway_http_requests_total{route="other",status="400"} 1.0' in metrics
