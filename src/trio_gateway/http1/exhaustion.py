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
from trio_gateway.http1.linger import ACCEPT_REFUSAL_LINGER, drop_until_closed

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

    Gently (``linger.py``): a client that writes its whole body before it reads would
    otherwise find its writes failing on a reset and never read its 503. Within
    ``ACCEPT_REFUSAL_LINGER``: this is the process's one spare descriptor, and every other
    refusal waits for it (a client that reads its answer and closes frees it within a round
    trip)."""
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
            await drop_until_closed(conn, ACCEPT_REFUSAL_LINGER)
        return True
    finally:
        reserve.restore()
