"""The wire's side of running out of descriptors (core/descriptors.py): the tally, the log
line once an interval, and the one descriptor held back so that a connection can still be
accepted at the limit, to be refused with a 503 instead of left waiting in the backlog."""

from __future__ import annotations

import json
import logging
import os
import socket

import trio

from trio_gateway.core.descriptors import LOG_INTERVAL_S, TALLY
from trio_gateway.core.errors import DescriptorsExhausted

log = logging.getLogger("trio_gateway.descriptors")

# What a connection accepted at the limit is told: a request needs two descriptors (the
# client's, the upstream's), and the process has none to spare.
_REFUSAL_BODY = json.dumps(
    DescriptorsExhausted("the gateway is out of file descriptors; retry shortly").to_body()
).encode()
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: application/json\r\n"
    b"retry-after: 1\r\n"
    b"connection: close\r\n"
    b"content-length: " + str(len(_REFUSAL_BODY)).encode() + b"\r\n\r\n" + _REFUSAL_BODY
)


# The accept refusal's lingering close (refuse_one): its bounds, and the buffer it drops into.
REFUSAL_LINGER_S = 1.0
REFUSAL_LINGER_IDLE_S = 0.1
REFUSAL_LINGER_BYTES = 64 << 20
_DROPPED = bytearray(1 << 18)


def note(where: str, exc: OSError) -> None:
    """Count one exhaustion at ``where`` and log it, once per interval, without a traceback."""
    since = TALLY.note(where, trio.current_time())
    if since is not None:
        log.warning(
            "out of file descriptors (%s) at %s: %d time(s) since the last such line; "
            "answering 503 overloaded (at most one line per %g s; raise the limit: "
            "docs/operations.md)",
            os.strerror(exc.errno) if exc.errno is not None else exc,
            where,
            since,
            LOG_INTERVAL_S,
        )


class Reserve:
    """One descriptor (of /dev/null) held back for the moment the process has no other."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self.restore()

    def restore(self) -> None:
        if self._fd is None:
            try:
                self._fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._fd = None  # still at the limit: tried again after the next refusal

    def release(self) -> bool:
        if self._fd is None:
            return False
        os.close(self._fd)
        self._fd = None
        return True

    def close(self) -> None:
        self.release()


async def refuse_one(listening: socket.socket, reserve: Reserve) -> bool:
    """At the limit: accept one waiting connection with the reserve's descriptor, answer it
    503, close it gently, take the reserve back. False when that was not possible (no
    reserve, or no connection waiting), and the caller should wait a moment instead.

    Gently: our end first, then what the client still sends is read and dropped until it
    closes too, as the server's lingering close does (server.py, ``LINGER_S``): a client that
    writes its whole body before it reads would otherwise find its writes failing on a reset
    and never read its 503. Here for ``REFUSAL_LINGER_S`` at most, ``REFUSAL_LINGER_IDLE_S``
    between reads: this is the process's one spare descriptor, and every other refusal waits
    for it (a client that reads its answer and closes frees it within a round trip)."""
    if not reserve.release():
        return False
    try:
        try:
            conn, _ = listening.accept()
        except OSError:
            return False
        with conn:
            conn.setblocking(False)
            try:
                conn.send(REFUSAL)
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                return True
            await _linger(conn)
        return True
    finally:
        reserve.restore()


async def _linger(conn: socket.socket) -> None:
    dropped = 0
    with trio.move_on_after(REFUSAL_LINGER_S):
        while dropped < REFUSAL_LINGER_BYTES:
            with trio.move_on_after(REFUSAL_LINGER_IDLE_S) as idle:
                await trio.lowlevel.wait_readable(conn)
            if idle.cancelled_caught:
                return
            try:
                read = conn.recv_into(_DROPPED)
            except BlockingIOError:
                continue
            except OSError:
                return
            if not read:
                return
            dropped += read
