"""hypercorn's trio serve loop, with listeners that remember every client connection.

hypercorn writes to a client shielded and without a timeout, and gives the app no handle on the
connection: a handler whose client stopped reading blocks in ``send`` until the kernel gives up
on the socket (TCP_USER_TIMEOUT, where the platform has it; forever where it has not). Keeping a
weak map from peer address to the accepted stream lets the gateway's own stall deadline drop that
connection itself: a shut-down socket makes the blocked write fail, hypercorn reports the close,
and the handler ends.

This replaces ``hypercorn.trio.run.worker_serve`` for plain-TCP HTTP/1.1 and h2c serving; it uses
hypercorn's ``TCPServer`` and ``WorkerContext`` as they are. The gateway's ASGI app answers
lifespan itself and needs none of its events, so there is no lifespan task.
"""

from __future__ import annotations

import logging
import socket
import struct
import weakref
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, cast

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, Framework
from hypercorn.utils import repr_socket_addr, wrap_app

from trio_gateway.core.descriptors import is_exhaustion
from trio_gateway.http1.exhaustion import Reserve, note, refuse_one
from trio_gateway.http1.server import H1Server, OnRefused

log = logging.getLogger("trio_gateway")

Peer = tuple[str, int]
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends RST
# At the descriptor limit with nothing to refuse: trio's own pause (serve_listeners).
EXHAUSTED_ACCEPT_PAUSE_S = 0.1


class Connections:
    """The open client connections, by the peer address hypercorn puts in ``scope["client"]``.

    Entries are weak: a connection hypercorn has finished with disappears by itself.
    """

    def __init__(self) -> None:
        self._streams: weakref.WeakValueDictionary[Peer, trio.SocketStream] = (
            weakref.WeakValueDictionary()
        )

    def __len__(self) -> int:
        """The connections still open. One closed may still be held a while, so its entry
        stays: trio's ``serve_listeners`` keeps the last stream it accepted in its frame until
        the next accept."""
        return sum(1 for stream in self._streams.values() if stream.socket.fileno() != -1)

    def add(self, stream: trio.SocketStream) -> None:
        try:
            peer = stream.socket.getpeername()
        except OSError:
            return  # already gone
        self._streams[(str(peer[0]), int(peer[1]))] = stream

    def abort(self, client: Any) -> bool:
        """Shut the connection of ``client`` (a scope's ``client`` value) down in both
        directions: a write blocked on it fails at once. Its close (hypercorn's, once the
        handler has returned) is then a reset: what the kernel still holds for a client that
        stalled is dropped, not trickled out to it before the end (at its pace, that took
        longer than the stall period itself). False when it is not open here."""
        peer = _peer(client)
        stream = None if peer is None else self._streams.pop(peer, None)
        if stream is None:
            return False
        try:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            stream.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
        return True

    def socket(self, client: Any) -> trio.socket.SocketType | None:
        """The socket of ``client``'s connection, None when it is not open here."""
        peer = _peer(client)
        stream = None if peer is None else self._streams.get(peer)
        return None if stream is None else stream.socket


def _peer(client: Any) -> Peer | None:
    if not isinstance(client, list | tuple) or len(client) < 2:
        return None
    return (str(client[0]), int(client[1]))


class _RecordingListener(trio.abc.Listener[trio.SocketStream]):
    """Records each connection (``Connections``); at the descriptor limit, refuses the waiting
    ones with a 503 (``exhaustion.refuse_one``) instead of leaving them in the backlog, where
    trio's ``serve_listeners`` would log a traceback every 100 ms."""

    def __init__(self, sock: socket.socket, connections: Connections, reserve: Reserve) -> None:
        self._sock = sock
        self._inner = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        self._connections = connections
        self._reserve = reserve

    async def accept(self) -> trio.SocketStream:
        while True:
            try:
                stream = await self._inner.accept()
            except OSError as exc:
                if not is_exhaustion(exc):
                    raise
                note("accept", exc)
                if not await refuse_one(self._sock, self._reserve):
                    await trio.sleep(EXHAUSTED_ACCEPT_PAUSE_S)
                continue
            self._connections.add(stream)
            return stream

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Shutdown(Exception):
    pass


def hypercorn_hand_off(
    app: Any, config: HypercornConfig, context: WorkerContext
) -> Callable[[trio.abc.Stream], Awaitable[None]]:
    """A connection (its bytes read so far replayed first) served by hypercorn's own
    handler: what the HTTP/1.x server does not speak (WebSocket, HTTP/2)."""
    wrapped = wrap_app(cast("Framework", app), config.wsgi_max_body_size, "asgi")

    async def serve(stream: trio.abc.Stream) -> None:
        await TCPServer(wrapped, config, context, ConnectionState({}), stream)  # type: ignore[arg-type]

    return serve


async def serve_asgi(
    app: Any,
    config: HypercornConfig,
    sockets: Sockets,
    connections: Connections,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    write_timeout_s: float,
    head_timeout_s: float,
    body_timeout_s: float,
    max_body_bytes: int,
    body_limit_name: str = "the limit",
    on_refused: OnRefused | None = None,
    websocket_paths: frozenset[str] = frozenset(),
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` on ``sockets`` until ``shutdown_trigger`` returns; then stop
    accepting and give open connections ``config.graceful_timeout``.

    HTTP/1.x is the gateway's own server (``http1/server.py``), and so is a WebSocket upgrade
    to one of ``websocket_paths`` (``http1/websocket.py``); any other upgrade, h2c and HTTP/2
    are handed to hypercorn's, with hypercorn's ``config`` (its keep-alive timeout and
    WebSocket message size are the other's too)."""
    context = WorkerContext(None)
    h1 = H1Server(
        app,
        hypercorn_hand_off(app, config, context),
        keep_alive_timeout_s=config.keep_alive_timeout,
        head_timeout_s=head_timeout_s,
        body_timeout_s=body_timeout_s,
        write_timeout_s=write_timeout_s,
        max_body_bytes=max_body_bytes,
        body_limit_name=body_limit_name,
        on_refused=on_refused,
        websocket_paths=websocket_paths,
        websocket_max_message_chars=config.websocket_max_message_size,
    )
    listeners = []
    binds = []
    reserve = Reserve()
    for sock in sockets.insecure_sockets:
        listeners.append(_RecordingListener(sock, connections, reserve))
        binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
    # The hang-up watch outlives the connections' nursery: a client may leave while draining.
    async with trio.open_nursery() as watching:
        await watching.start(h1.hang_ups.serve)
        async with trio.open_nursery() as server_nursery:
            task_status.started(binds)
            try:
                async with trio.open_nursery() as nursery:

                    async def stop_when_triggered() -> None:
                        await shutdown_trigger()
                        raise _Shutdown

                    nursery.start_soon(stop_when_triggered)
                    nursery.start_soon(
                        partial(
                            trio.serve_listeners,
                            h1.serve,
                            listeners,
                            handler_nursery=server_nursery,
                        )
                    )
            except* _Shutdown:
                pass
            finally:
                reserve.close()
                h1.terminate()
                await context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        watching.cancel_scope.cancel()
