"""A real TCP connection on loopback, both ends in the test's hands."""

from __future__ import annotations

import trio


async def connected_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """(client, server side) of one connection; the listener is closed already."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listener:
        client = await trio.open_tcp_stream("127.0.0.1", listener.socket.getsockname()[1])
        server = await listener.accept()
    return client, server
