"""The deadlines of an upstream stream's reads, without a cancel scope per read or a task per
stream.

A stream has two deadlines: the first token by ``first_deadline``, then no read waiting longer
than ``idle_s`` for data. The obvious ``with trio.fail_after(idle_s)`` around every read costs a
fresh cancel scope and a generator-based context manager per chunk: measured at ~30 µs a read,
about a tenth of the gateway's CPU per relayed chunk (docs/benchmarks.md); moving one scope's
deadline costs 7 µs a read. Here the reader only notes when a read starts and ends (two
attribute stores), and one task per upstream (:class:`ReadDeadlines`) sleeps until the earliest
moment any of its streams' deadlines could pass, checks them, and cancels the reads' scope of
each one that did: no task, nursery or sleep of its own per stream (at thousands of streams,
kilobytes each; docs/benchmarks.md, scenario D).

Time spent *between* reads (handing an event to a slow client) is not upstream idleness: the
client stall deadline covers it, so a timer only counts while a read is waiting.
"""

from __future__ import annotations

import math
from types import TracebackType
from typing import NoReturn

import trio


class ReadTimer:
    def __init__(self, *, first_deadline: float, idle_s: float) -> None:
        self.first_deadline = first_deadline
        self.idle_s = idle_s
        self.started = False  # an event came: the idle deadline applies from now on
        self.read_since = math.inf  # when the read in progress began; inf: not reading
        self.expired: str | None = None  # "first" or "idle" once a watcher cancelled
        # Enclose the reads with this scope; the watcher cancels it when a deadline passes.
        self.scope = trio.CancelScope()

    def reading(self) -> None:
        self.read_since = trio.current_time()

    def read_done(self) -> None:
        self.read_since = math.inf

    def due(self) -> float:
        """When the read in progress runs out of time (inf when none is in progress)."""
        if not self.started:
            # The first-token deadline runs from the request, reads or not.
            return self.first_deadline
        return self.read_since + self.idle_s

    def next_look(self, now: float) -> float:
        """The latest time a watcher may look again and still not be late: a read that starts
        after ``now`` has its deadline at least ``idle_s`` after it."""
        return min(self.due(), now + self.idle_s)

    def check(self, now: float) -> bool:
        """Cancel :attr:`scope` when a deadline has passed; True then."""
        if self.due() > now:
            return False
        self.expired = "idle" if self.started else "first"
        self.scope.cancel()
        return True

    async def watch(self) -> None:
        """This timer's own watcher, for a stream whose upstream has no :class:`ReadDeadlines`
        running: start in the readers' nursery and cancel that nursery when the reads end."""
        while True:
            now = trio.current_time()
            if self.check(now):
                return
            await trio.sleep_until(self.next_look(now))


class ReadDeadlines:
    """Every read timer of one upstream, kept by one task (:meth:`serve`).

    The task sleeps until the earliest :meth:`ReadTimer.next_look` of the timers it holds; a
    timer added with an earlier one wakes it sooner. Per chunk nothing is done but the reader's
    two stores; per stream, an add and a discard; per ``idle_s``, one look at every stream."""

    def __init__(self) -> None:
        self._timers: set[ReadTimer] = set()
        self._sleep: trio.CancelScope | None = None
        self.running = False

    def __len__(self) -> int:
        return len(self._timers)

    def keeping(self, timer: ReadTimer) -> _Kept:
        """``with deadlines.keeping(timer):`` around the reads (inside ``timer.scope``)."""
        return _Kept(self, timer)

    def _add(self, timer: ReadTimer) -> None:
        self._timers.add(timer)
        sleep = self._sleep
        if sleep is not None:
            look = timer.next_look(trio.current_time())
            if look < sleep.deadline:
                sleep.deadline = look

    async def serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        self.running = True
        try:
            task_status.started()
            while True:
                now = trio.current_time()
                wake = math.inf
                for timer in list(self._timers):
                    if timer.check(now):
                        self._timers.discard(timer)
                    else:
                        wake = min(wake, timer.next_look(now))
                with trio.CancelScope(deadline=wake) as self._sleep:
                    await trio.sleep_forever()
                self._sleep = None
        finally:
            self.running = False
            self._sleep = None


class _Kept:
    """A class, not ``@contextmanager``: one per stream, and a generator is half a KiB more."""

    def __init__(self, deadlines: ReadDeadlines, timer: ReadTimer) -> None:
        self._deadlines = deadlines
        self._timer = timer

    def __enter__(self) -> None:
        self._deadlines._add(self._timer)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._deadlines._timers.discard(self._timer)
