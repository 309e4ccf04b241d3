"""Every early refusal closes gently (nginx's ``lingering_close``): a client that writes its
whole body before it reads, as most do, reads its answer instead of a reset (issue 39.8). And
the lingering is bounded: in bytes, in time, and in connections at once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.e2e.harness import gateway_config, provider_toml, running_gateway
from tests.e2e.test_auth import keys_toml
from tests.e2e.test_h1_server import client, echo, serving
from trio_gateway.core.keys import new_key
from trio_gateway.http1 import linger
from trio_gateway.http1.server import H1Server
from trio_gateway.process.serve import GatewayHandle

MIB = 1 << 20
PIECE = b"x" * (256 * 1024)


@asynccontextmanager
async def gateway(server: str = "", auth: str = "") -> AsyncIterator[GatewayHandle]:
    # No request reaches the provider: every one is refused first.
    provider = provider_toml("nowhere", "http://127.0.0.1:9", api_key_env=None)
    config = gateway_config(provider, server + auth)
    async with running_gateway(config) as handle:
        yield handle


async def write_all_then_read(port: int, head: bytes, body_bytes: int) -> bytes:
    """A client that sends its head and then its whole body, and only then reads the answer,
    to its end: what it read. A write that fails (the gateway reset the connection) fails it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head)
        sent = 0
        while sent < body_bytes:
            piece = PIECE[: body_bytes - sent]
            await stream.send_all(piece)
            sent += len(piece)
        answer = b""
        with trio.fail_after(10):
            while data := await stream.receive_some(65536):
                answer += data
        return answer


def post_head(path: str, body_bytes: int, *extra: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1".encode(), b"host: gw", b"content-type: application/json"]
    lines += [b"content-length: %d" % body_bytes, *extra]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def error_of(answer: bytes) -> tuple[int, dict[str, str]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(body)["error"]


async def test_fifty_clients_writing_20_mb_against_a_1_mb_limit_each_read_their_413() -> None:
    async with gateway(server=f"max_body_bytes = {MIB}") as handle:
        port = int(handle.base_url.rsplit(":", 1)[1])
        head = post_head("/v1/chat/completions", 20 * MIB)
        answers: list[bytes] = []
        limiter = trio.CapacityLimiter(10)

        async def one() -> None:
            async with limiter:
                answers.append(await write_all_then_read(port, head, 20 * MIB))

        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(one)
    assert len(answers) == 50
    for answer in answers:
        status, error = error_of(answer)
        assert status == 413
        assert b"connection: close" in answer.lower()
        assert error["code"] == "body_too_large"
        assert error["message"] == (
            f"request body of {20 * MIB} bytes is larger than server.max_body_bytes ({MIB} bytes)"
        )


REFUSALS = [
    # From the head, by the server.
    ("two lengths", post_head("/v1/chat/completions", 4 * MIB, b"content-length: 7"), 400),
    (
        "gzip, chunked",
        b"POST /v HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
        501,
    ),
    ("HTTP/1.2", post_head("/v", 4 * MIB).replace(b"HTTP/1.1", b"HTTP/1.2"), 505),
    # From the head, by the app: the body is never read.
    ("no such route", post_head("/v1/nothing", 4 * MIB), 404),
    ("GET with a body", post_head("/healthz", 4 * MIB).replace(b"POST", b"PUT"), 405),
]


@pytest.mark.parametrize(
    ("head", "status"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
async def test_every_refusal_before_the_body_is_read_lingers(head: bytes, status: int) -> None:
    async with gateway() as handle:
        port = int(handle.base_url.rsplit(":", 1)[1])
        async with trio.open_nursery() as nursery:
            answers: list[bytes] = []

            async def one() -> None:
                answers.append(await write_all_then_read(port, head, 4 * MIB))

            for _ in range(5):
                nursery.start_soon(one)
    assert [error_of(a)[0] for a in answers] == [status] * 5


async def test_a_key_refused_before_its_body_is_read_is_told_so(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(keys_toml({"alice": new_key()}))
    async with gateway(auth=f'\n[auth]\nkeys_file = "{keys_file}"\n') as handle:
        port = int(handle.base_url.rsplit(":", 1)[1])
        head = post_head("/v1/chat/completions", 4 * MIB, b"authorization: Bearer nope")
        answer = await write_all_then_read(port, head, 4 * MIB)
    assert error_of(answer)[0] == 401


async def lingering_reaches(server: H1Server, count: int) -> float:
    """When ``server.lingering`` became ``count`` (polled: the server announces nothing)."""
    with trio.fail_after(60):
        while server.lingering != count:  # noqa: ASYNC110 - no event to wait on
            await trio.sleep(0.01)
    return trio.current_time()


REFUSED = b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 5000\r\n\r\n"


async def test_at_most_max_lingering_connections_linger_the_next_closes_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(linger, "MAX_LINGERING", 2)
    async with (
        serving(echo, max_body_bytes=1000) as (server, port),
        client(port) as a,
        client(port) as b,
        client(port) as c,
    ):
        for each in (a, b, c):
            await each.send(REFUSED)
            status, _, _ = await each.response()
            assert status.startswith(b"HTTP/1.1 413")
        await lingering_reaches(server, 2)
        assert server.closed_unlingered == 1
        # The two that linger take what their clients still send; the third is closed, and
        # its client's next bytes are answered with a reset.
        for each in (a, b):
            await each.send(b"x" * 1000)
        with pytest.raises(trio.BrokenResourceError), trio.fail_after(5):
            while True:
                await c.send(b"x" * 1000)
                await c.stream.receive_some(65536)
        assert server.lingering == 2
    await lingering_reaches(server, 0)


async def test_lingering_ends_when_the_client_is_silent_or_writes_for_too_long(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with (
        serving(echo, max_body_bytes=1000) as (server, port),
        client(port) as silent,
        client(port) as trickling,
    ):
        started = trio.current_time()
        for each in (silent, trickling):
            await each.send(REFUSED)
            await each.response()
        async with trio.open_nursery() as nursery:

            async def trickle() -> None:
                while True:
                    await trio.sleep(linger.SERVER_LINGER.idle_s / 2)
                    await trickling.send(b"x")

            nursery.start_soon(trickle)
            await lingering_reaches(server, 2)
            silent_ended = await lingering_reaches(server, 1) - started
            trickling_ended = await lingering_reaches(server, 0) - started
            nursery.cancel_scope.cancel()
    assert silent_ended == pytest.approx(linger.SERVER_LINGER.idle_s, abs=0.1)
    assert trickling_ended == pytest.approx(linger.SERVER_LINGER.total_s, abs=0.1)
