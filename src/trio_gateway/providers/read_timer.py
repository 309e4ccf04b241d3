"""The deadline of an upstream stream's reads, without a cancel scope per read.

A stream has two deadlines: the first token by ``first_deadline``, then no read waiting longer
than ``idle_s`` for data. The obvious ``with trio.fail_after(idle_s)`` around every read costs a
fresh cancel scope and a generator-based context manager per chunk: measured at ~30 µs a read,
about a tenth of the gateway's CPU per relayed chunk (docs/benchmarks.md). Here the reader only
notes when a read starts and ends (two attribute stores), and one task per stream sleeps until
the earliest moment a deadline could pass, checks, and cancels the reads' scope if it did.

Time spent *between* reads (handing an event to a slow client) is not upstream idleness: the
client stall deadline covers it, so the timer only counts while a read is waiting.
"""

from __future__ import annotations

import math

import trio


class ReadTimer:
    def __init__(self, *, first_deadline: float, idle_s: float) -> None:
        self.first_deadline = first_deadline
        self.idle_s = idle_s
        self.started = False  # an event came: the idle deadline applies from now on
        self.read_since = math.inf  # when the read in progress began; inf: not reading
        self.expired: str | None = None  # "first" or "idle" once the watcher cancelled
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

    async def watch(self) -> None:
        """Cancel :attr:`scope` once a deadline passes; start in the readers' nursery and
        cancel that nursery when the reads end.

        A read that starts later than this task's check has its deadline at least ``idle_s``
        after it, so sleeping at most ``idle_s`` between checks never wakes late: one wake per
        ``idle_s`` per stream, nothing per chunk."""
        while True:
            now = trio.current_time()
            due = self.due()
            if due <= now:
                self.expired = "idle" if self.started else "first"
                self.scope.cancel()
                return
            await trio.sleep_until(min(due, now + self.idle_s))
