"""A capacity limiter whose waiters are served by rank, lowest first, FIFO among equal ranks.

The borrower API of ``trio.CapacityLimiter`` (which gate.py used before), with one addition: a
waiter brings a *rank*, and a freed slot goes to the waiter of the lowest rank. The router makes
the rank (dispatch/router.py, ``queue_rank``)::

    rank = arrival time + priority x priority_aging_s

so a request of priority ``p`` is served as if it had arrived ``p x priority_aging_s`` seconds
later: lower numbers go first, equal priorities in arrival order, and a waiting request gains
one class per ``priority_aging_s`` it has waited. That is the starvation bound: a request of
priority ``p`` is overtaken only by requests of a priority ``q < p`` that arrive less than
``(p - q) x priority_aging_s`` after it; any request arriving later than that queues behind it.
A rank is fixed when the request first queues, so a heap keeps the order (no re-sorting as
time passes).

Slots are handed over on release, as trio's limiter does: a freed slot goes straight to the
first waiter, so a free slot and a waiter never coexist, and ``*_nowait`` never takes a slot
ahead of someone waiting. A cancelled waiter leaves the queue at once (its abort runs before
anything else can hand it a slot).
"""

from __future__ import annotations

import heapq
import itertools

import attrs
import trio

__all__ = ["LimiterStats", "PriorityLimiter"]

# Dead entries (cancelled waiters) are dropped from the heap once they outnumber the live ones
# (plus this slack, so a small queue is not rebuilt at every cancellation).
_COMPACT_SLACK = 16


@attrs.frozen
class LimiterStats:
    borrowed_tokens: int
    tasks_waiting: int
    total_tokens: int


@attrs.define(eq=False)
class _Waiter:
    rank: float
    serial: int  # arrival order: FIFO among equal ranks
    task: trio.lowlevel.Task
    borrower: object
    live: bool = True

    def __lt__(self, other: _Waiter) -> bool:
        return (self.rank, self.serial) < (other.rank, other.serial)


class PriorityLimiter:
    """``total_tokens`` slots; waiters served by rank (see the module docstring)."""

    def __init__(self, total_tokens: int) -> None:
        if total_tokens < 0:
            raise ValueError("total_tokens must be >= 0")
        self._total = total_tokens
        self._borrowers: set[object] = set()
        self._heap: list[_Waiter] = []
        self._waiting = 0  # live entries of the heap
        self._serial = itertools.count()

    @property
    def total_tokens(self) -> int:
        return self._total

    @total_tokens.setter
    def total_tokens(self, value: int) -> None:
        if value < 0:
            raise ValueError("total_tokens must be >= 0")
        self._total = value
        self._hand_over()

    def statistics(self) -> LimiterStats:
        return LimiterStats(len(self._borrowers), self._waiting, self._total)

    def acquire_on_behalf_of_nowait(self, borrower: object) -> None:
        """A free slot for ``borrower``, or ``trio.WouldBlock``: none is free, or someone waits."""
        if borrower in self._borrowers:
            raise RuntimeError("this borrower already holds one of this limiter's tokens")
        if self._waiting or len(self._borrowers) >= self._total:
            raise trio.WouldBlock
        self._borrowers.add(borrower)

    async def acquire_on_behalf_of(self, borrower: object, rank: float | None = None) -> None:
        """A slot for ``borrower``, waiting in rank order (None: now, i.e. arrival order)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self.acquire_on_behalf_of_nowait(borrower)
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _Waiter(
            rank=trio.current_time() if rank is None else rank,
            serial=next(self._serial),
            task=trio.lowlevel.current_task(),
            borrower=borrower,
        )
        heapq.heappush(self._heap, waiter)
        self._waiting += 1

        def abort(_: object) -> trio.lowlevel.Abort:
            # Runs synchronously at cancellation: no hand-over can reach this waiter after it.
            waiter.live = False
            self._waiting -= 1
            if len(self._heap) > 2 * self._waiting + _COMPACT_SLACK:
                self._heap = [w for w in self._heap if w.live]
                heapq.heapify(self._heap)
            return trio.lowlevel.Abort.SUCCEEDED

        # _hand_over put the borrower in _borrowers before rescheduling us.
        await trio.lowlevel.wait_task_rescheduled(abort)

    def release_on_behalf_of(self, borrower: object) -> None:
        if borrower not in self._borrowers:
            raise RuntimeError("this borrower isn't holding any of this limiter's tokens")
        self._borrowers.remove(borrower)
        self._hand_over()

    def _hand_over(self) -> None:
        while self._waiting and len(self._borrowers) < self._total:
            waiter = heapq.heappop(self._heap)
            if not waiter.live:
                continue
            waiter.live = False
            self._waiting -= 1
            self._borrowers.add(waiter.borrower)
            trio.lowlevel.reschedule(waiter.task)
