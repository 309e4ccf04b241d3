"""The lingering close: a connection closed before its request was read whole (a refusal) is
closed gently, as nginx's ``lingering_close`` does. The caller writes its answer and shuts its
own end (``SHUT_WR``); then what the client still sends is read and dropped until it closes too.

Closed at once, the client's bytes arriving at a closed socket make the kernel reset the
connection: a client that writes its whole body before it reads (most do) fails on its next write
and never reads its answer (20 MB against a 1 MB limit: ``BrokenPipeError`` instead of the 413).
Every wait is bounded: in all, between reads, and in bytes (docs/architecture.md, "The HTTP/1.x
edge")."""

from __future__ import annotations

import os
import socket

import attrs
import trio


@attrs.frozen
class LingerBounds:
    total_s: float
    idle_s: float  # between reads: a client that says nothing is not waited for longer
    max_bytes: int


# The server's (nginx's lingering_time and lingering_timeout), at most MAX_LINGERING connections
# at once per server: past it a connection closes at once, as without lingering.
SERVER_LINGER = LingerBounds(total_s=30.0, idle_s=5.0, max_bytes=64 << 20)
MAX_LINGERING = 256
# The accept refusal at the descriptor limit (exhaustion.py): it lingers on the process's one
# spare descriptor, which every other refusal waits for.
ACCEPT_REFUSAL_LINGER = LingerBounds(total_s=1.0, idle_s=0.1, max_bytes=64 << 20)

_DROPPED = bytearray(1 << 18)  # what is read, never kept: one buffer for every connection


async def drop_until_closed(
    sock: socket.socket | trio.socket.SocketType, bounds: LingerBounds
) -> None:
    """Read and drop what ``sock`` receives until its peer closes (or resets), within
    ``bounds``."""
    dropped = 0
    with trio.move_on_after(bounds.total_s):
        while dropped < bounds.max_bytes:
            with trio.move_on_after(bounds.idle_s) as idle:
                await trio.lowlevel.wait_readable(sock)
            if idle.cancelled_caught:
                return
            try:
                read = os.readv(sock.fileno(), [_DROPPED])
            except BlockingIOError:
                continue
            except OSError:
                return  # reset, or closed under us: it is gone
            if not read:
                return  # it closed too: the answer was read, or never will be
            dropped += read
