"""``Connections``: a client connection found by the peer address hypercorn reports, asked whether
its socket has room (the stall deadline's "is the client the one behind?") and shut down."""

from __future__ import annotations

import os

import trio

from trio_gateway.listen import Connections


async def connected_pair() -> tuple[trio.SocketStream, trio.SocketStream, trio.SocketListener]:
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listener.accept()
    return client, server, listener


async def test_a_socket_has_room_until_its_client_stops_reading() -> None:
    client, server, listener = await connected_pair()
    async with client, server, listener:
        connections = Connections()
        connections.add(server)
        peer = list(client.socket.getsockname())
        assert connections.writable(peer) is True
        # The client reads nothing: fill the kernel's buffers until a write would block.
        chunk = b"x" * 65536
        while True:
            try:
                os.write(server.socket.fileno(), chunk)  # non-blocking: raises when full
            except BlockingIOError:
                break
        assert connections.writable(peer) is False
        # Reading it all gives the room back.
        with trio.move_on_after(2):
            while not connections.writable(peer):
                await client.receive_some(1 << 20)
        assert connections.writable(peer) is True


async def test_unknown_clients_are_neither_writable_nor_abortable() -> None:
    client, server, listener = await connected_pair()
    async with client, server, listener:
        connections = Connections()
        connections.add(server)
        for unknown in (None, "x", ["127.0.0.1"], ["127.0.0.1", 1]):
            assert connections.writable(unknown) is None
            assert connections.abort(unknown) is False
        peer = list(client.socket.getsockname())
        assert connections.abort(peer) is True
        assert connections.writable(peer) is None  # forgotten once dropped
        assert await client.receive_some(10) == b""
