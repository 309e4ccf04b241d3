"""DirectBody on real TCP sockets: its bytes on the wire, and when it says a client stalled or
left. The clients here are raw sockets that read as fast, as slowly, or as little as each test
needs; the stall periods are short, so these run on the real clock."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import pytest
import trio
import trio.lowlevel

from trio_gateway.dispatch.relay import ClientLeft, ClientStalled
from trio_gateway.fronts.direct import (
    CLIENT_NOTSENT_LOWAT_BYTES,
    ClientSocket,
    DirectBody,
    unacked_bytes,
)

STALL_S = 0.6


@asynccontextmanager
async def pair(rcvbuf: int | None = None) -> AsyncIterator[tuple[trio.SocketStream, socket.socket]]:
    """The gateway's side as trio has it, and a plain client socket (blocking calls are made
    from a thread where a test needs a client that reads)."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    client = socket.socket()
    if rcvbuf is not None:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    client.setblocking(False)
    with suppress(BlockingIOError):
        client.connect(listener.socket.getsockname())
    server = await listener.accept()
    client.setblocking(True)
    try:
        yield server, client
    finally:
        client.close()
        await server.aclose()
        await listener.aclose()


def body(server: trio.SocketStream, *, chunked: bool = True) -> DirectBody:
    return ClientSocket(server.socket, chunked=chunked).body(STALL_S)


def read_exactly(client: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        data += client.recv(n - len(data))
    return data


async def test_chunked_framing_is_a_size_line_the_data_and_a_crlf() -> None:
    async with pair() as (server, client):
        writer = body(server)
        await writer.write(b"data: hi\n\n")
        await writer.write(b"")  # nothing: not even an empty chunk (that would end the body)
        await writer.write(b"x" * 300)
        expected = b"a\r\ndata: hi\n\n\r\n" + b"12c\r\n" + b"x" * 300 + b"\r\n"
        assert read_exactly(client, len(expected)) == expected
        assert writer.lag.written == len(expected)


async def test_http10_bodies_are_written_as_they_are() -> None:
    async with pair() as (server, client):
        writer = body(server, chunked=False)
        await writer.write(b"data: hi\n\n")
        assert read_exactly(client, 10) == b"data: hi\n\n"


async def test_a_client_that_reads_nothing_is_stalled_after_the_period() -> None:
    async with pair(rcvbuf=4096) as (server, _client):
        writer = body(server)
        started = trio.current_time()
        with pytest.raises(ClientStalled), trio.fail_after(10):
            while True:
                await writer.write(b"x" * 4096)
        # From its first unread byte (the first writes), within one mark of the period.
        assert STALL_S <= trio.current_time() - started <= STALL_S + 0.5


async def test_a_client_behind_only_in_the_kernel_s_buffers_is_stalled_too() -> None:
    # Small writes, far apart, into a buffer large enough for all of them (a streamed answer
    # keeps unsent bytes under 4 KiB, TCP_NOTSENT_LOWAT; a platform without it buffers
    # megabytes): no write ever waits; the kernel's count of unacknowledged bytes is all that
    # shows the client is behind.
    async with pair(rcvbuf=4096) as (server, _client):
        writer = body(server)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        if hasattr(socket, "TCP_NOTSENT_LOWAT"):
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, 1 << 20)
        if unacked_bytes(server.socket.fileno()) is None:
            pytest.skip("the platform does not count unacknowledged bytes")
        started = trio.current_time()
        with pytest.raises(ClientStalled), trio.fail_after(10):
            while True:
                await writer.write(b"y" * 1000)
                await trio.sleep(0.02)  # the answer's pace: 50 KB/s
        assert writer.debt_s == 0.0  # never waited for room
        assert STALL_S <= trio.current_time() - started <= STALL_S + 1.0


async def test_a_client_that_reads_too_slowly_is_stalled() -> None:
    # 1 KiB each 20 ms is never "reading nothing", and no single wait lasts a period: the
    # leaky bucket of waits is what finds it behind.
    async with pair(rcvbuf=4096) as (server, client):
        writer = body(server)
        taken = 0

        def slow_reader() -> None:
            nonlocal taken
            client.settimeout(5)
            try:
                while True:
                    data = client.recv(1024)
                    if not data:
                        return
                    taken += len(data)
                    trio.from_thread.run(trio.sleep, 0.02)
            except OSError:
                return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, slow_reader)
            started = trio.current_time()
            with pytest.raises(ClientStalled), trio.fail_after(10):
                while True:
                    await writer.write(b"z" * 4096)
            elapsed = trio.current_time() - started
            client.shutdown(socket.SHUT_RDWR)
        assert taken > 10_000  # it did read, steadily
        assert STALL_S <= elapsed <= 4 * STALL_S


async def test_a_client_that_keeps_up_is_never_behind() -> None:
    async with pair() as (server, client):
        writer = body(server)
        taken = 0

        def reader() -> None:
            nonlocal taken
            while data := client.recv(1 << 16):
                taken += len(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, reader)
            deadline = trio.current_time() + 3 * STALL_S
            writes = 0
            while trio.current_time() < deadline:
                await writer.write(b"k" * 4096)
                writes += 1
                if writes % 16 == 0:
                    await trio.lowlevel.checkpoint()
            await server.send_eof()
        assert taken == writer.lag.written


async def test_a_client_that_reset_its_connection_has_left() -> None:
    async with pair() as (server, client):
        writer = body(server)
        await writer.write(b"first")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset, not a FIN
        with pytest.raises(ClientLeft), trio.fail_after(5):
            while True:
                await writer.write(b"more")
                await trio.sleep(0.01)


async def test_a_closed_socket_is_never_written() -> None:
    async with pair() as (server, _client):
        writer = body(server)
        server.socket.close()
        with pytest.raises(ClientLeft):
            await writer.write(b"x")
        with pytest.raises(ClientLeft):
            await writer.wait_room()


async def test_wait_room_returns_at_once_with_room_and_stalls_without() -> None:
    async with pair(rcvbuf=4096) as (server, _client):
        writer = body(server)
        await writer.wait_room()
        started = trio.current_time()
        with pytest.raises(ClientStalled), trio.fail_after(10):
            while True:
                await writer.write(b"x" * 4096)
        # Full: a wait for room alone is a stall as well.
        writer.debt_s = 0.0
        with pytest.raises(ClientStalled):
            await writer.wait_room()
        assert trio.current_time() - started >= STALL_S


STALLED_AT_ONCE = 50


async def test_stalled_clients_at_once_each_leave_little_unsent_in_the_kernel() -> None:
    # trio keeps up to 16 KiB unsent on its sockets (TCP_NOTSENT_LOWAT); a streamed answer
    # keeps 4 KiB: what a client that stops reading has not taken is that much less. Fifty
    # answers written at once, every one bounded (the setting is per socket; the kernel's
    # memory is shared).
    if not hasattr(socket, "TCP_NOTSENT_LOWAT"):
        pytest.skip("the platform has no TCP_NOTSENT_LOWAT")
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            (await stack.enter_async_context(pair(rcvbuf=4096)))[0] for _ in range(STALLED_AT_ONCE)
        ]
        writers = [body(server, chunked=False) for server in servers]
        for server in servers:
            assert (
                server.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT)
                == CLIENT_NOTSENT_LOWAT_BYTES
            )

        async def flood(writer: DirectBody) -> None:
            while True:
                await writer.write(b"x" * 200)
                await trio.lowlevel.checkpoint()

        with trio.move_on_after(STALL_S / 2):
            async with trio.open_nursery() as nursery:
                for writer in writers:
                    nursery.start_soon(flood, writer)
        # The client's window (its 4 KiB buffer, doubled by the kernel) and the 4 KiB unsent;
        # with trio's 16 KiB, about 24 KiB each.
        assert all(writer.debt_s > 0 for writer in writers)  # each one's kernel said "full"
        unacked = [unacked_bytes(server.socket.fileno()) for server in servers]
        assert all(n is not None and n < 14 * 1024 for n in unacked), unacked
