"""A worker's connection to its supervisor's host broker (``[server] workers``; the broker is
``process/host_broker.py``, the wire ``core/host_wire.py``).

``call`` sends a frame and parks the calling task until the answer of its number comes;
``post`` sends one that wants no answer. Both write at once, without a task of their own: the
socket is a local one the broker reads all the time, so a write that does not fit is rare, and
what does not fit waits in a bounded buffer that ``serve``'s writer sends. ``serve`` (started
with ``nursery.start``) reads the answers and wakes their callers. When the connection ends
(the supervisor is gone), every call waiting fails with ``HostLinkClosed``, and so does every
later one.
"""

from __future__ import annotations

import itertools
import logging
import socket
from typing import NoReturn

import outcome
import trio

from trio_gateway.core.host_wire import FrameError, FrameReader, encode_frame

log = logging.getLogger("trio_gateway")

RECEIVE_BYTES = 65536
# Unsent bytes waiting for the broker to read. Frames are some 40 bytes: this is tens of
# thousands of them, which only a broker that stopped reading lets pile up.
MAX_UNSENT_BYTES = 4 * 1024 * 1024
# Calls waiting for their answer (each a request of this worker, waiting for a slot or an
# admission): beyond, a call is refused at once.
MAX_PENDING_CALLS = 100_000


async def write_unsent(sock: socket.socket, unsent: bytearray) -> bool:
    """Send all of ``unsent`` (taking what went out from it) as ``sock`` takes it; False when
    the socket failed. The writer's side of both ends (this link, the broker's)."""
    while unsent:
        await trio.lowlevel.wait_writable(sock)
        try:
            sent = sock.send(unsent)
        except BlockingIOError:
            continue
        except OSError:
            return False
        del unsent[:sent]
    return True


class HostLinkClosed(ConnectionError):
    """The connection to the host broker is gone, or cannot take more."""


class HostLink:
    """This worker's end of the socketpair its supervisor made (``--broker-fd``)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._ids = itertools.count(1)
        self._calls: dict[int, trio.lowlevel.Task] = {}
        self._unsent = bytearray()
        self._unsent_event = trio.Event()
        self.closed = False
        self.round_trips = 0

    def new_call(self) -> int:
        """A number for a ``call`` (and for a ``post`` that refers to it later)."""
        return next(self._ids)

    @property
    def pending(self) -> int:
        return len(self._calls)

    def post(self, method: int, body: bytes, call: int = 0) -> None:
        """Send a frame that wants no answer (dropped silently once the link is closed: what it
        would have given back, the broker gave back when the connection ended)."""
        if not self.closed:
            self._send(encode_frame(call, method, body))

    async def call(self, call: int, method: int, body: bytes) -> bytes:
        """Send a frame and wait for its answer's body. Cancelled, the answer is dropped when
        it comes: the caller undoes whatever the broker did (a slot granted meanwhile)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.closed:
            raise HostLinkClosed("the host broker is gone")
        if len(self._calls) >= MAX_PENDING_CALLS:
            raise HostLinkClosed(f"{MAX_PENDING_CALLS} calls already wait for the host broker")
        self._send(encode_frame(call, method, body))
        if self.closed:  # the send found the socket broken
            raise HostLinkClosed("the host broker is gone")
        self._calls[call] = trio.lowlevel.current_task()
        self.round_trips += 1

        def abort(_: object) -> trio.lowlevel.Abort:
            self._calls.pop(call, None)
            return trio.lowlevel.Abort.SUCCEEDED

        reply: bytes = await trio.lowlevel.wait_task_rescheduled(abort)
        return reply

    def _send(self, frame: bytes) -> None:
        if self._unsent:
            self._queue(frame)
            return
        try:
            sent = self._sock.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close("the host broker's socket failed")
            return
        if sent < len(frame):
            self._queue(frame[sent:])

    def _queue(self, rest: bytes) -> None:
        if len(self._unsent) + len(rest) > MAX_UNSENT_BYTES:
            self._close(f"the host broker has not read {MAX_UNSENT_BYTES} bytes")
            return
        self._unsent += rest
        self._unsent_event.set()

    def _close(self, why: str | None) -> None:
        if self.closed:
            return
        self.closed = True
        if why is not None:
            log.error("workers: %s; the limits shared with the other workers are unavailable", why)
        calls, self._calls = self._calls, {}
        for task in calls.values():
            trio.lowlevel.reschedule(task, outcome.Error(HostLinkClosed(why or "closed")))
        self._unsent_event.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read the broker's answers until the connection ends (then the link is closed)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_unsent)
            task_status.started()
            try:
                await self._read()
                self._close("the connection to the host broker ended")
            finally:
                # Cancelled: the worker itself is stopping (nothing to say about it).
                self._close(None)
                nursery.cancel_scope.cancel()

    async def _read(self) -> None:
        reader = FrameReader()
        while True:
            try:
                await trio.lowlevel.wait_readable(self._sock)
                data = self._sock.recv(RECEIVE_BYTES)
            except BlockingIOError:
                continue
            except (OSError, trio.ClosedResourceError):
                return
            if not data:
                return
            try:
                frames = reader.feed(data)
            except FrameError as exc:
                log.error("workers: the host broker sent %s", exc)
                return
            calls = self._calls
            for frame in frames:
                task = calls.pop(frame.call, None)
                if task is not None:
                    trio.lowlevel.reschedule(task, outcome.Value(bytes(frame.body)))

    async def _write_unsent(self) -> NoReturn:
        while not self.closed:
            await self._unsent_event.wait()
            self._unsent_event = trio.Event()
            if not await write_unsent(self._sock, self._unsent):
                self._close("the host broker's socket failed")
        await trio.sleep_forever()

    def close(self) -> None:
        trio.lowlevel.notify_closing(self._sock)
        self._sock.close()
