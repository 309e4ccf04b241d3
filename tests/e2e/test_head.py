"""``HEAD`` wherever ``GET`` works, on a real gateway: the GET's status and headers, no body, and
a kept-alive connection whose next request is read right (raw bytes, httpx, and HTTP/2)."""

from __future__ import annotations

import logging
import re

import httpx
import pytest
import trio

from tests.e2e.harness import Stack

TIMEOUT_S = 10
# Every route a GET serves; /v1/models/{id} through an alias the test config has.
GET_ROUTES = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/",
    "/status",
    "/status.json",
    "/v1/models",
    "/v1/models/agent-lite",
)
# Headers that may differ between two answers a moment apart.
VARYING = {"date", "x-request-id", "content-length"}


def port_of(stack: Stack) -> int:
    return int(stack.gateway.base_url.rsplit(":", 1)[1])


async def read_all(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


def split_head(data: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """The status line, the headers (lower-cased names) and what follows the head."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, data[:200]
    line, *fields = head.split(b"\r\n")
    headers = {}
    for field in fields:
        name, _, value = field.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return line, headers, rest


async def test_head_is_the_get_without_its_body_on_a_raw_kept_alive_connection(
    stack: Stack,
) -> None:
    """Pipelined in one write: HEAD, GET, HEAD, GET of each route. A HEAD answer with body bytes
    after its head would be read as the start of the next answer: each next answer must begin
    exactly where the HEAD's head ends."""
    requests = b""
    for path in GET_ROUTES:
        for method in (b"HEAD", b"GET"):
            requests += method + b" " + path.encode() + b" HTTP/1.1\r\nHost: gw\r\n\r\n"
    requests += b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
    with trio.fail_after(TIMEOUT_S):
        stream = await trio.open_tcp_stream("127.0.0.1", port_of(stack))
        async with stream:
            await stream.send_all(requests)
            data = await read_all(stream)
    for path in GET_ROUTES:
        head_line, head_headers, data = split_head(data)
        get_line, get_headers, data = split_head(data)
        length = int(get_headers[b"content-length"])
        body, data = data[:length], data[length:]
        assert head_line == get_line == b"HTTP/1.1 200 OK", path
        assert {k for k in head_headers} == {k for k in get_headers}, path
        for name, value in get_headers.items():
            if name.decode() not in VARYING:
                assert head_headers[name] == value, (path, name)
        # The GET's own body is what its length says; the HEAD's length is a GET's (the
        # numbers on /metrics and /status.json may move between the two by a digit or so).
        assert len(body) == length and length > 0, path
        assert abs(int(head_headers[b"content-length"]) - length) <= length // 10, path
        assert b"connection" not in head_headers, path  # kept alive
    last_line, _, rest = split_head(data)
    assert last_line == b"HTTP/1.1 200 OK"
    assert rest.startswith(b'{"status": "ok"') or rest.startswith(b'{"status":"ok"')


async def test_a_head_then_a_get_on_one_connection_one_at_a_time(stack: Stack) -> None:
    with trio.fail_after(TIMEOUT_S):
        stream = await trio.open_tcp_stream("127.0.0.1", port_of(stack))
        async with stream:
            await stream.send_all(b"HEAD /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
            got = b""
            while b"\r\n\r\n" not in got:
                got += await stream.receive_some(65536)
            line, headers, rest = split_head(got)
            assert line == b"HTTP/1.1 200 OK" and rest == b""
            assert headers[b"content-type"] == b"application/json"
            assert int(headers[b"content-length"]) > 0
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
            got = await read_all(stream)
    # The next bytes are the GET's answer: nothing of a body came after the HEAD's head.
    line, headers, body = split_head(got)
    assert line == b"HTTP/1.1 200 OK"
    assert len(body) == int(headers[b"content-length"])


async def test_a_head_of_a_post_only_route_is_405_as_its_get_is(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        head = await client.head(stack.v1 + "/chat/completions")
        get = await client.get(stack.v1 + "/chat/completions")
        missing = await client.head(stack.gateway.base_url + "/nowhere")
    assert head.status_code == get.status_code == 405
    assert head.content == b""
    assert missing.status_code == 404 and missing.content == b""


@pytest.mark.parametrize("http2", [False, True], ids=["http1.1", "http2"])
async def test_httpx_heads_every_get_route_and_the_connection_goes_on(
    stack: Stack, http2: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """httpx (h11 on HTTP/1.1, which would take stray body bytes as a broken next answer; h2
    with prior knowledge, which hypercorn serves) on one connection."""
    caplog.set_level(logging.DEBUG, "trio_gateway.access")
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(
        timeout=TIMEOUT_S, limits=limits, http1=not http2, http2=http2
    ) as client:
        for path in GET_ROUTES:
            head = await client.head(stack.gateway.base_url + path)
            get = await client.get(stack.gateway.base_url + path)
            assert head.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
            assert (head.status_code, get.status_code) == (200, 200), path
            assert head.content == b"" and get.content != b"", path
            assert head.headers["content-type"] == get.headers["content-type"], path
    access = [r for r in caplog.records if r.name == "trio_gateway.access"]
    heads = {r.__dict__["access"]["route"] for r in access if "HEAD" in str(r.__dict__["access"])}
    assert heads == {f"HEAD {path}" for path in GET_ROUTES}
    # A monitor's HEAD probes are as quiet in the log as its GETs.
    for record in access:
        if re.fullmatch(
            r"(HEAD|GET) /(healthz|readyz|metrics)", record.__dict__["access"]["route"]
        ):
            assert record.levelno == logging.DEBUG
