"""Upstream answers held to the same rules as requests (issue 26), on real sockets: framing two
parsers could read two ways is the provider's protocol error and its connection is never used
again; a content coding is decoded or refused, never passed on as its bytes."""

from __future__ import annotations

import gzip
import zlib

import pytest
import trio

from tests.unit.test_h1_client import chunk, pool, read_all, read_request, server
from trio_gateway.core.errors import UpstreamProtocolError

OK = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


def answering(*answers: bytes) -> object:
    """A server that answers its n-th connection's requests with ``answers[n]``, then waits."""

    async def handler(stream: trio.SocketStream, n: int) -> None:
        while await read_request(stream):
            await stream.send_all(answers[min(n, len(answers) - 1)])

    return handler


GOOD = OK + b"content-length: 9\r\n\r\ndata: a\n\n"


@pytest.mark.parametrize(
    "answer",
    [
        OK + b"content-length: 9\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"data: a\n\n"),
        OK + b"content-length: 5\r\ncontent-length: 7\r\n\r\ndata: a\n\n",
        OK + b"content-length: 9\r\ncontent-length: 9\r\n\r\ndata: a\n\n",
        OK + "content-length: ²\r\n\r\ndata: a\n\n".encode(),
        OK + b"content-length: 9, 9\r\n\r\ndata: a\n\n",
        OK + b"content-length: +9\r\n\r\ndata: a\n\n",
        OK + b"transfer-encoding: gzip\r\n\r\ndata: a\n\n",
        OK + b"transfer-encoding: chunked\r\n\r\n1_0\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n",
        OK + b"transfer-encoding: chunked\r\n\r\n9\ndata: a\n\n\n0\n\n",
        OK + b"x: a\r\n b\r\ncontent-length: 9\r\n\r\ndata: a\n\n",
        b"HTTP/2.0 200 OK\r\ncontent-length: 9\r\n\r\ndata: a\n\n",
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n",
        OK + b"content-encoding: br\r\ncontent-length: 9\r\n\r\ndata: a\n\n",
        OK + b"x: " + b"a" * 70_000 + b"\r\ncontent-length: 9\r\n\r\ndata: a\n\n",
    ],
    ids=[
        "cl-with-te",
        "cl-5-and-7",
        "cl-twice",
        "cl-superscript",
        "cl-list",
        "cl-plus",
        "te-gzip",
        "chunk-size-underscore",
        "chunk-bare-lf",
        "obs-fold",
        "http2-status-line",
        "101",
        "brotli",
        "head-too-large",
    ],
)
async def test_an_answer_framed_ambiguously_is_a_protocol_error_and_its_connection_is_dropped(
    answer: bytes,
) -> None:
    async with server(answering(answer, GOOD)) as (url, accepted):  # type: ignore[arg-type]
        client = pool()
        with pytest.raises(UpstreamProtocolError) as caught:
            response = await client.post(url, {}, b"{}")
            try:
                await read_all(response)
            finally:
                await response.aclose()
        assert caught.value.provider == "up"
        assert caught.value.message.startswith("up: ")
        assert client.idle_count() == 0
        response = await client.post(url, {}, b"{}")  # a new connection, answered well
        assert await read_all(response) == b"data: a\n\n"
        await response.aclose()
        assert len(accepted) == 2


async def test_bytes_after_an_answer_keep_its_connection_from_being_used_again() -> None:
    async with server(answering(GOOD + b"HTTP/1.1 200 OK\r\n", GOOD)) as (url, accepted):  # type: ignore[arg-type]
        client = pool()
        for _ in range(2):
            response = await client.post(url, {}, b"{}")
            assert await read_all(response) == b"data: a\n\n"
            await response.aclose()
        assert len(accepted) == 2  # the first connection was not given a second request


@pytest.mark.parametrize(
    ("coding", "compress"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
    ],
)
async def test_a_compressed_answer_is_decoded_whatever_its_chunks(
    coding: str, compress: object
) -> None:
    events = b"".join(b"data: %d\n\n" % i for i in range(200))
    packed: bytes = compress(events)  # type: ignore[operator]
    body = b"".join(chunk(packed[i : i + 7]) for i in range(0, len(packed), 7)) + b"0\r\n\r\n"
    answer = OK + f"content-encoding: {coding}\r\ntransfer-encoding: chunked\r\n\r\n".encode()
    async with server(answering(answer + body)) as (url, _):  # type: ignore[arg-type]
        response = await pool().post(url, {}, b"{}")
        out = b""
        while not response.ended:
            out += b"".join(await response.receive())
        await response.aclose()
    assert out == events


async def test_a_compressed_answer_cut_short_is_refused() -> None:
    packed = gzip.compress(b"data: a\n\n" * 100)[:-12]  # the stream's end is missing
    answer = OK + b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(packed) + packed
    async with server(answering(answer)) as (url, _):  # type: ignore[arg-type]
        response = await pool().post(url, {}, b"{}")
        with pytest.raises(UpstreamProtocolError, match="ends before its compressed stream"):
            while not response.ended:
                await response.receive()
        await response.aclose()


async def test_a_decompression_bomb_is_refused_not_held() -> None:
    packed = gzip.compress(b"\0" * (64 * 1024 * 1024))  # 64 MiB from some 64 KB
    answer = OK + b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(packed) + packed
    async with server(answering(answer)) as (url, _):  # type: ignore[arg-type]
        response = await pool().post(url, {}, b"{}")
        with pytest.raises(UpstreamProtocolError, match="decodes to more than"):
            while not response.ended:
                await response.receive()
        await response.aclose()


async def test_the_request_asks_for_no_coding() -> None:
    seen: list[bytes] = []

    async def record(stream: trio.SocketStream, _: int) -> None:
        seen.append(await read_request(stream))
        await stream.send_all(GOOD)

    async with server(record) as (url, _):
        response = await pool().post(url, {}, b"{}")
        await read_all(response)
        await response.aclose()
    assert b"\r\naccept-encoding: identity" in seen[0]
