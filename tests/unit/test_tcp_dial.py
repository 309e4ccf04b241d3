"""Dialling with the receive buffer set before the handshake: the order of attempts, the
happy-eyeballs stagger, failures, and the buffer itself, against real loopback sockets."""

from __future__ import annotations

import gc
import os
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

from trio_gateway.http1.dial import (
    HAPPY_EYEBALLS_DELAY_S,
    AddrInfo,
    attempt_order,
    open_tcp_stream,
)

V4 = socket.AF_INET
V6 = socket.AF_INET6
TCP = socket.SOCK_STREAM


def info(family: socket.AddressFamily, host: str, port: int = 1) -> AddrInfo:
    address: tuple[Any, ...] = (host, port) if family == V4 else (host, port, 0, 0)
    return (family, TCP, 6, "", address)


@pytest.mark.parametrize(
    ("given", "tried"),
    [
        ([], []),
        (["4a"], ["4a"]),
        (["4a", "4b", "4c"], ["4a", "4b", "4c"]),
        (["6a", "6b", "4a", "4b"], ["6a", "4a", "6b", "4b"]),
        (["4a", "6a", "6b"], ["4a", "6a", "6b"]),
        (["6a", "6b", "6c", "4a"], ["6a", "4a", "6b", "6c"]),
    ],
)
def test_the_other_family_is_tried_second(given: list[str], tried: list[str]) -> None:
    def make(name: str) -> AddrInfo:
        return info(V4, name) if name[0] == "4" else info(V6, name)

    assert [i[4][0] for i in attempt_order([make(n) for n in given])] == tried


class Resolver(trio.abc.HostnameResolver):
    """Answers every name with ``infos``, in that order."""

    def __init__(self, infos: list[AddrInfo]) -> None:
        self.infos = infos

    async def getaddrinfo(  # type: ignore[override]  # its results as the resolver's
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[AddrInfo]:
        await trio.lowlevel.checkpoint()
        return self.infos

    async def getnameinfo(
        self, sockaddr: tuple[str, int] | tuple[str, int, int, int], flags: int
    ) -> tuple[str, str]:
        raise NotImplementedError


@contextmanager
def resolving(*ports: int) -> Iterator[None]:
    previous = trio.socket.set_custom_hostname_resolver(
        Resolver([info(V4, "127.0.0.1", port) for port in ports])
    )
    try:
        yield
    finally:
        trio.socket.set_custom_hostname_resolver(previous)


@contextmanager
def listening(backlog: int = 16) -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    with sock:
        yield sock


@contextmanager
def unanswered() -> Iterator[int]:
    """A port whose SYNs go unanswered: a listener with backlog 0 and its one slot taken."""
    with listening(backlog=0) as sock, socket.socket() as first:
        first.connect(sock.getsockname())
        yield sock.getsockname()[1]


def refused() -> int:
    """A port nobody listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_the_receive_buffer_is_set_before_the_handshake() -> None:
    """Set after the handshake, the buffer is the same size, but the window its SYN offered
    was sized for the default one: the client's window clamp stays at 64 KiB and the server
    sizes its segments at 32 KiB, more than the window it will be offered."""
    with listening() as sock, resolving(sock.getsockname()[1]):
        stream = await open_tcp_stream("upstream", 1, rcvbuf_bytes=16384)
        server, _ = sock.accept()
        with server:
            assert stream.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * 16384
            assert stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP) <= 16384
            assert server.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG) <= 16384 // 2
            # trio's own stream settings are kept.
            assert stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            await stream.aclose()


DIALS_AT_ONCE = 64


async def test_many_dials_at_once_each_get_the_small_window_from_the_start() -> None:
    """The buffer belongs to each attempt's own socket, not to anything shared between dials
    in flight together: every one of 64 concurrent connections offered the small window in
    its SYN."""
    streams: list[trio.SocketStream] = []
    with listening(backlog=DIALS_AT_ONCE * 2) as sock, resolving(sock.getsockname()[1]):

        async def dial() -> None:
            streams.append(await open_tcp_stream("upstream", 1, rcvbuf_bytes=16384))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for _ in range(DIALS_AT_ONCE):
                    nursery.start_soon(dial)
        servers = [sock.accept()[0] for _ in range(DIALS_AT_ONCE)]
        try:
            assert len(streams) == DIALS_AT_ONCE
            clamps = {s.getsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP) for s in streams}
            assert max(clamps) <= 16384
            segments = {s.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG) for s in servers}
            assert max(segments) <= 16384 // 2
        finally:
            for server in servers:
                server.close()
            for stream in streams:
                await stream.aclose()


async def test_an_address_that_does_not_answer_costs_one_delay(
    autojump_clock: trio.abc.Clock,
) -> None:
    with unanswered() as silent, listening() as sock, resolving(silent, sock.getsockname()[1]):
        started = trio.current_time()
        with trio.fail_after(5):  # without the stagger: forever, the SYN retried for minutes
            stream = await open_tcp_stream("upstream", 1, rcvbuf_bytes=16384)
        waited = trio.current_time() - started
        assert stream.socket.getpeername() == sock.getsockname()
        assert HAPPY_EYEBALLS_DELAY_S <= waited < 2 * HAPPY_EYEBALLS_DELAY_S + 0.01
        await stream.aclose()


async def test_a_refused_address_gives_way_at_once(autojump_clock: trio.abc.Clock) -> None:
    with listening() as sock, resolving(refused(), sock.getsockname()[1]):
        started = trio.current_time()
        stream = await open_tcp_stream("upstream", 1, rcvbuf_bytes=16384)
        assert trio.current_time() - started < HAPPY_EYEBALLS_DELAY_S
        assert stream.socket.getpeername() == sock.getsockname()
        await stream.aclose()


async def test_one_address_refused_is_its_own_error() -> None:
    with resolving(refused()), pytest.raises(ConnectionRefusedError):
        await open_tcp_stream("upstream", 1, rcvbuf_bytes=16384)


async def test_every_address_refused_names_the_host_and_the_last_error() -> None:
    with resolving(refused(), refused()), pytest.raises(OSError) as caught:
        await open_tcp_stream("upstream", 8000, rcvbuf_bytes=16384)
    assert str(caught.value).startswith("all attempts to connect to upstream:8000 failed: ")
    assert "Connection refused" in str(caught.value)


async def test_a_name_with_no_address_is_an_error() -> None:
    with resolving(), pytest.raises(OSError, match="no address for 'upstream'"):
        await open_tcp_stream("upstream", 1, rcvbuf_bytes=16384)


async def test_a_dial_cancelled_while_waiting_leaves_no_socket_open(
    autojump_clock: trio.abc.Clock,
) -> None:
    with unanswered() as silent, resolving(silent, silent):
        # Counted after a collection: an earlier test's socket that the collector closes
        # during this one is not this dial's (seen when tests share a process with others).
        gc.collect()
        fds_before = set(os.listdir("/proc/self/fd"))
        with warnings.catch_warnings(record=True) as caught:
            # A socket left to the collector would close too, but with this warning.
            warnings.simplefilter("always", ResourceWarning)
            with trio.move_on_after(1.0) as late:
                await open_tcp_stream("upstream", 1, rcvbuf_bytes=16384)
            gc.collect()
        assert late.cancelled_caught
        assert set(os.listdir("/proc/self/fd")) - fds_before == set()
        assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
