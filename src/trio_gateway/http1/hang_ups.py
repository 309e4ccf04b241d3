"""Which clients hung up, for every answer at once, watched by one task.

The server's hang-up watch (``server.py`` makes one per server); the fronts (``fronts/chat.py``,
``fronts/direct.py``) and the simulator find it in a request's scope extensions.
"""

from __future__ import annotations

import contextlib
import select
from collections.abc import Callable

import trio

_HANG_UP = getattr(select, "EPOLLRDHUP", 0) | select.EPOLLHUP | select.EPOLLERR
# A look at the hang-up set every this many chunks written: at ~75 µs a chunk, every 2.4 ms of a
# burst.
TICKS_PER_POLL = 32
MAX_HANG_UPS_PER_POLL = 1024


class HangUps:
    """Which clients hung up, for every answer at once: the connections whose answer is being
    given, in one ``epoll`` set of their own that reports only a peer's end (``EPOLLRDHUP``, and
    the hang-ups and errors epoll always reports), waited on by one task (:meth:`serve`).

    A disconnect watcher per request costs a task, its coroutines and a cancel scope, some
    3.5 KiB, held as long as the answer: at thousands of streams, a tenth of each one's memory
    (docs/benchmarks.md, scenario D). Where the platform has no ``EPOLLRDHUP`` (or the service
    is not running), requests keep watching ``receive()`` themselves.

    The set is also looked at by whoever is busiest (:meth:`tick`, once per chunk written): a
    burst of thousands of chunks is one long turn of trio's run loop, and a hang-up that came
    during it would otherwise wait for the turn to end before :meth:`serve` even ran."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "EPOLLRDHUP") else None
        self._callbacks: dict[int, Callable[[], object]] = {}
        self._ticks = 0
        self.running = False

    def __len__(self) -> int:
        return len(self._callbacks)

    def watch(self, fd: int, callback: Callable[[], object]) -> None:
        """Call ``callback`` once when the peer of the socket ``fd`` hangs up (until
        :meth:`unwatch`). It is called from another task: it may cancel and close, not wait."""
        epoll = self._epoll
        assert epoll is not None
        try:
            epoll.register(fd, _HANG_UP)
        except FileExistsError:
            epoll.modify(fd, _HANG_UP)  # a watch whose unwatch never came: this one replaces it
        except (OSError, ValueError):
            callback()  # closed already (fd -1, or gone): its client has left
            return
        self._callbacks[fd] = callback

    def unwatch(self, fd: int, callback: Callable[[], object]) -> None:
        """Stop :meth:`watch`'s ``callback`` (not a later watch of the same descriptor)."""
        if self._callbacks.get(fd) is callback:
            del self._callbacks[fd]
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)  # type: ignore[union-attr]

    def poll(self) -> None:
        """Call the callbacks of the hang-ups that have come, now."""
        epoll = self._epoll
        if epoll is None or not self.running:
            return
        for fd, _ in epoll.poll(0, MAX_HANG_UPS_PER_POLL):
            callback = self._callbacks.pop(fd, None)
            with contextlib.suppress(OSError, ValueError):
                epoll.unregister(fd)
            if callback is not None:
                callback()

    def tick(self) -> None:
        """One unit of work done (a chunk written): every ``TICKS_PER_POLL``, a look at the set,
        one ``epoll_wait`` that does not wait (about a microsecond)."""
        self._ticks += 1
        if self._ticks >= TICKS_PER_POLL:
            self._ticks = 0
            if self._callbacks:
                self.poll()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        epoll = self._epoll
        if epoll is None:
            task_status.started()
            return
        self.running = True
        try:
            task_status.started()
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                self.poll()
        finally:
            self.running = False
            epoll.close()
