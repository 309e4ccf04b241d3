"""``Connections``: a client connection found by the peer address hypercorn reports (its socket,
for an answer written to it directly) and shut down."""

from __future__ import annotations

import pytest
import trio

from tests.sockets import connected_pair
from trio_gateway.http1.listen import Connections


async def test_a_client_s_socket_is_found_by_its_peer_address() -> None:
    client, server = await connected_pair()
    async with client, server:
        connections = Connections()
        connections.add(server)
        peer = list(client.socket.getsockname())
        assert connections.socket(peer) is server.socket
        assert connections.socket(tuple(peer)) is server.socket
        assert len(connections) == 1


async def test_unknown_clients_have_no_socket_and_cannot_be_aborted() -> None:
    client, server = await connected_pair()
    async with client, server:
        connections = Connections()
        connections.add(server)
        for unknown in (None, "x", ["127.0.0.1"], ["127.0.0.1", 1]):
            assert connections.socket(unknown) is None
            assert connections.abort(unknown) is False
        peer = list(client.socket.getsockname())
        assert connections.abort(peer) is True
        assert connections.socket(peer) is None  # forgotten once dropped
        assert await client.receive_some(10) == b""


async def test_an_aborted_connection_is_reset_not_trickled_out() -> None:
    # A stalled client: the kernel holds what it has not taken. After the abort, the close
    # discards it; the client learns of the end at once, not after reading all of it.
    client, server = await connected_pair()
    connections = Connections()
    connections.add(server)
    written = 0
    with trio.move_on_after(1):
        while True:
            await server.send_all(b"x" * 65536)
            written += 65536
    assert connections.abort(list(client.socket.getsockname())) is True
    await server.aclose()
    received = 0
    with pytest.raises(trio.BrokenResourceError), trio.fail_after(5):
        while data := await client.receive_some(65536):
            received += len(data)
    assert received < written
    await client.aclose()


async def test_a_closed_connection_still_held_is_not_counted_as_open() -> None:
    client, server = await connected_pair()
    async with client:
        connections = Connections()
        connections.add(server)
        assert len(connections) == 1
        await server.aclose()  # closed, but this test (like trio's accept loop) still holds it
        assert len(connections) == 0
