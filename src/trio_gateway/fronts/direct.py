"""A streamed answer's body written straight to the client's socket (HTTP/1.x over TCP).

hypercorn takes every body message through four awaiting layers (its ASGI wrapper, the HTTP
stream, the h11 protocol, the TCP server) and then a send lock and a shielded cancel scope around
trio's ``send_all``: about a third of the gateway's CPU per relayed chunk, and a write no deadline
can interrupt (docs/benchmarks.md). Once hypercorn has written the head of a 200, the body of an
HTTP/1.1 answer without a content-length is chunk frames (h11 chooses chunked framing), that of
an HTTP/1.0 answer its bytes until the connection closes. :class:`DirectBody` writes those with
one non-blocking ``send`` each and waits only when the kernel's buffer is full; the end of the
body still goes through hypercorn (h11 writes the last chunk and gets ready for the next
request), so hypercorn's view of the connection stays right.

Nothing else writes the socket meanwhile: during an answer on an HTTP/1.x connection hypercorn
writes only what the app sends (h11 holds a pipelined request back until the answer ends), and
the handler calls hypercorn again only after its last direct write. hypercorn closes the socket
only after the handler has returned; a socket closed anyway reads as ``fileno() == -1`` and is
never written (its descriptor number may already be another connection's).

A client past its stall deadline (:class:`DirectBody` says when) is :class:`ClientStalled`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import socket
import struct
import termios
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from trio_gateway.dispatch.relay import ClientLeft, ClientStalled
from trio_gateway.ops.lag import LagMeter

if TYPE_CHECKING:
    from trio_gateway.http1.hang_ups import HangUps

# A look at the kernel's count of unacknowledged bytes at most this often (one ioctl): the lag
# is known to within this much.
LAG_MARK_EVERY_S = 0.25
# More marks than a stall period holds are never needed (the client is dropped first); the
# bound only keeps a clock that jumps from growing the deque.
MAX_LAG_MARKS = 512
# Unsent bytes the kernel takes for a streamed answer before a write waits (trio sets 16 KiB on
# its sockets). A client that keeps up is never held back by it (bytes in flight do not count);
# of one that falls behind, the kernel holds that much less, and its upstream feels it that much
# sooner (docs/benchmarks.md, scenario E). A token's chunk is a few hundred bytes: this is still
# a dozen of them.
CLIENT_NOTSENT_LOWAT_BYTES = 4096
_INT = struct.Struct("i")
_GONE = frozenset(
    {errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF, errno.ESHUTDOWN, errno.ETIMEDOUT}
)


def unacked_bytes(fd: int) -> int | None:
    """The bytes written to ``fd`` that its peer has not acknowledged (Linux's SIOCOUTQ, which
    is TIOCOUTQ's number); None where the platform does not say."""
    try:
        return int(_INT.unpack(fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except OSError:
        return None


@attrs.frozen
class ClientSocket:
    """An HTTP/1.x client's socket under hypercorn; ``chunked``: HTTP/1.1, whose answers
    without a content-length h11 frames in chunks (HTTP/1.0's end with the connection)."""

    sock: trio.socket.SocketType
    chunked: bool
    # The server's hang-up watch (http1.hang_ups), where it runs: told of each chunk written.
    hang_ups: HangUps | None = None

    def body(self, stall_timeout_s: float) -> DirectBody:
        tick = self.hang_ups.tick if self.hang_ups is not None else None
        return DirectBody(
            self.sock, chunked=self.chunked, stall_timeout_s=stall_timeout_s, tick=tick
        )


class DirectBody:
    """The body bytes of one answer, to ``sock``, framed as chunks when ``chunked``.

    The client is *behind* by the longer of two times: the age of the oldest byte it has not
    acknowledged (``lag.py``: what the kernel holds for it, however large its buffer), and the
    time it has kept the answer waiting, a leaky bucket: each wait for room in a full buffer
    adds its length, each stretch the answer flowed takes as much away. A client that reads
    nothing is behind from its first unread byte; one that reads, but slower than the answer
    comes, keeps the writer waiting most of the time (no single wait need be long: the kernel
    wakes a writer every few KiB) and falls behind as surely. Past ``stall_timeout_s``, it is
    :class:`ClientStalled`. A client that keeps up is never behind, however far the gateway is:
    a write waits only on the client's socket."""

    def __init__(
        self,
        sock: trio.socket.SocketType,
        *,
        chunked: bool,
        stall_timeout_s: float,
        tick: Callable[[], None] | None = None,
    ) -> None:
        self._sock = sock
        self._chunked = chunked
        self._tick = tick  # called once per write
        self.stall_timeout_s = stall_timeout_s
        self.lag = LagMeter(mark_every_s=LAG_MARK_EVERY_S, max_marks=MAX_LAG_MARKS)
        self.debt_s = 0.0  # the leaky bucket
        self._flowing_since: float | None = None
        if hasattr(socket, "TCP_NOTSENT_LOWAT"):
            with contextlib.suppress(OSError):
                sock.setsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, CLIENT_NOTSENT_LOWAT_BYTES
                )

    def _fd(self) -> int:
        fd = self._sock.fileno()
        if fd < 0:
            raise ClientLeft("the connection is closed")
        return fd

    def _socket_lag(self, fd: int, now: float) -> float:
        """The age of the oldest byte not acknowledged, from below (0 where the kernel does
        not count)."""
        unacked = unacked_bytes(fd)
        return 0.0 if unacked is None else self.lag.sample(now, unacked)

    async def write(self, data: bytes) -> None:
        """Hand ``data`` to the kernel: at once when its buffer has room (the usual case: no
        checkpoint, no task switch), else wait for room within the stall deadline."""
        if not data:
            return
        fd = self._fd()
        now = trio.current_time()
        if self.lag.due(now):
            behind = self._socket_lag(fd, now)
            if behind >= self.stall_timeout_s:
                raise ClientStalled(f"behind by {behind:.1f} s")
        frame = b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data
        sent = _send(fd, frame)
        self.lag.written += sent
        if self._tick is not None:
            self._tick()
        if sent < len(frame):
            await self._send_rest(memoryview(frame)[sent:])

    async def wait_room(self) -> None:
        """Return once the socket would take more bytes, within the stall deadline: then
        hypercorn's own last write (which no deadline can interrupt) does not block."""
        if not _writable(self._fd()):
            await self._send_rest(memoryview(b""))

    async def _send_rest(self, rest: memoryview) -> None:
        """The kernel's buffer is full: wait for room, looking again each time the stall
        deadline would pass (bytes taken meanwhile push it back)."""
        blocked_at = trio.current_time()
        if self._flowing_since is not None:
            self.debt_s = max(0.0, self.debt_s - (blocked_at - self._flowing_since))
        try:
            while True:
                now = trio.current_time()
                behind = max(self._socket_lag(self._fd(), now), self.debt_s + (now - blocked_at))
                if behind >= self.stall_timeout_s:
                    raise ClientStalled(f"behind by {behind:.1f} s")
                with trio.move_on_after(self.stall_timeout_s - behind):
                    try:
                        await trio.lowlevel.wait_writable(self._sock)
                    except trio.ClosedResourceError:
                        raise ClientLeft("the connection was closed") from None
                fd = self._fd()
                if not rest:
                    if _writable(fd):
                        return
                    continue
                sent = _send(fd, rest)
                self.lag.written += sent
                rest = rest[sent:]
                if not rest:
                    return
        finally:
            now = trio.current_time()
            self.debt_s += now - blocked_at
            self._flowing_since = now


def _send(fd: int, data: bytes | memoryview) -> int:
    """What the kernel took of ``data`` without waiting (0 when its buffer is full)."""
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        if exc.errno in _GONE:
            raise ClientLeft(os.strerror(exc.errno or 0)) from None
        raise


def _writable(fd: int) -> bool:
    # poll, not select: select refuses descriptors past 1024.
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return bool(poller.poll(0))
