"""The connect timeout counts the upstream's time, not the gateway's: a dial whose own loop is
busy before its SYN goes out (a storm of arrivals: scenario D at 9,000 streams failed 2,543
dials to the simulator on loopback as "connect timed out") still connects, and an address that
never answers still times out. Real sockets; the busy loop is a blocking sleep in the dial."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from trio_gateway.core.errors import UpstreamUnreachable
from trio_gateway.http1.client import H1Pool, Origin

CONNECT_TIMEOUT_S = 0.2
BUSY_S = 0.5  # longer than the connect timeout, shorter than twice it and the 0.25 s more


@pytest.fixture
def busy_before_the_syn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Name resolution that holds the whole loop for BUSY_S, as thousands of other requests'
    work does between a dial's first step and its SYN."""
    resolve = trio.socket.getaddrinfo

    async def slow(*args: Any, **kwargs: Any) -> Any:
        got = await resolve(*args, **kwargs)
        time.sleep(BUSY_S)  # noqa: ASYNC251 - the point: a loop that is late
        return got

    monkeypatch.setattr(trio.socket, "getaddrinfo", slow)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.create_server(("127.0.0.1", 0), backlog=16)
    try:
        yield sock
    finally:
        sock.close()


def _pool(timeout_s: float = CONNECT_TIMEOUT_S) -> H1Pool:
    return H1Pool(
        "up", max_idle=1, idle_expiry_s=1, connect_timeout_s=timeout_s, write_timeout_s=1,
        environ={},
    )  # fmt: skip


@pytest.mark.usefixtures("busy_before_the_syn")
async def test_a_busy_loop_before_the_syn_is_not_a_connect_timeout(
    listener: socket.socket,
) -> None:
    pool = _pool()
    stream = await pool._dial(Origin("http", "127.0.0.1", listener.getsockname()[1]))
    peer, _ = listener.accept()  # the very connection the dial made
    try:
        await stream.send_all(b"ping")
        assert peer.recv(4) == b"ping"
    finally:
        peer.close()
        await stream.aclose()


@pytest.fixture
def silent() -> Iterator[tuple[str, int]]:
    """A listener whose accept queue is full: the kernel drops further SYNs, so a handshake
    never completes (and nothing is refused either)."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = []
    try:
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(full.getsockname())
            fillers.append(filler)
        time.sleep(0.1)
        yield full.getsockname()
    finally:
        for filler in fillers:
            filler.close()
        full.close()


async def test_an_address_that_never_answers_times_out_in_the_connect_timeout(
    silent: tuple[str, int],
) -> None:
    pool = _pool()
    start = trio.current_time()
    with trio.fail_after(5), pytest.raises(UpstreamUnreachable) as caught:
        await pool._dial(Origin("http", *silent))
    assert caught.value.message == "up: connect timed out"
    assert CONNECT_TIMEOUT_S <= trio.current_time() - start < 2 * CONNECT_TIMEOUT_S


@pytest.mark.usefixtures("busy_before_the_syn")
async def test_a_busy_loop_does_not_stretch_a_silent_dial_past_twice_the_timeout(
    silent: tuple[str, int],
) -> None:
    pool = _pool(timeout_s=BUSY_S / 4)
    start = trio.current_time()
    with trio.fail_after(5), pytest.raises(UpstreamUnreachable) as caught:
        await pool._dial(Origin("http", *silent))
    assert caught.value.message == "up: connect timed out"
    # The busy part was the gateway's, and the whole dial is still bounded.
    assert trio.current_time() - start < BUSY_S + 2 * (BUSY_S / 4) + 0.2


DIALS_AT_ONCE = 200


async def test_many_dials_at_once_behind_a_busy_loop_all_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many at once, as a storm dials: each one's resolution holds the loop for 10 ms in turn,
    so most send their SYN seconds after they began, far past their connect timeout."""
    resolve = trio.socket.getaddrinfo

    async def slow(*args: Any, **kwargs: Any) -> Any:
        got = await resolve(*args, **kwargs)
        time.sleep(0.01)  # noqa: ASYNC251 - each arrival's work, on the one loop
        return got

    monkeypatch.setattr(trio.socket, "getaddrinfo", slow)
    server = socket.create_server(("127.0.0.1", 0), backlog=DIALS_AT_ONCE + 16)
    pool = _pool()
    origin = Origin("http", "127.0.0.1", server.getsockname()[1])
    streams: list[trio.abc.Stream] = []

    async def one() -> None:
        streams.append(await pool._dial(origin))

    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for _ in range(DIALS_AT_ONCE):
                    nursery.start_soon(one)
        assert len(streams) == DIALS_AT_ONCE
    finally:
        for stream in streams:
            await stream.aclose()
        server.close()
