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

A ``Reservation`` holds slots back for the better classes: a borrower of a priority above
``max_priority`` (a *capped* one) may hold at most ``total - slots`` of them, the others may use
every slot. A higher priority never displaces a running one, so this is what leaves a free slot
for a better class that arrives while the limiter is full of a worse one. A privileged borrower
takes its slot out of the reserved ones first: capped borrowers may hold ``total - slots``
whatever the privileged hold, as long as the total is not reached (so the capped class loses
exactly ``slots / total`` of the capacity under saturation, no more).

Slots are handed over on release, as trio's limiter does: a freed slot goes straight to the
best-ranked waiter that may hold it, so a free slot and a waiter who may take it never
coexist, and ``*_nowait`` never takes a slot ahead of someone waiting for it. A capped waiter
at the head of the queue does not hold up a privileged one behind it when only a reserved slot
is free. A cancelled waiter leaves the queue at once (its abort runs before anything else can
hand it a slot).
"""

from __future__ import annotations

import heapq
import itertools

import attrs
import trio

__all__ = ["NO_RESERVATION", "LimiterStats", "PriorityLimiter", "Reservation"]

# Dead entries (cancelled waiters) are dropped from the heap once they outnumber the live ones
# (plus this slack, so a small queue is not rebuilt at every cancellation).
_COMPACT_SLACK = 16


@attrs.frozen
class LimiterStats:
    borrowed_tokens: int
    tasks_waiting: int
    total_tokens: int
    capped_borrowed: int = 0  # of borrowed_tokens, held by the capped class
    capped_waiting: int = 0  # of tasks_waiting, of the capped class


@attrs.frozen
class Reservation:
    """``slots`` held back for priorities <= ``max_priority`` (lower numbers are better)."""

    slots: int = 0
    max_priority: int = 0

    def capped(self, priority: int) -> bool:
        """Whether a borrower of ``priority`` may hold only the unreserved slots."""
        return self.slots > 0 and priority > self.max_priority


NO_RESERVATION = Reservation()


@attrs.define(eq=False)
class _Waiter:
    rank: float
    serial: int  # arrival order: FIFO among equal ranks
    task: trio.lowlevel.Task
    borrower: object
    priority: int
    capped: bool  # of the reservation in force (a resize may change it)
    live: bool = True

    def __lt__(self, other: _Waiter) -> bool:
        return (self.rank, self.serial) < (other.rank, other.serial)


class PriorityLimiter:
    """``total_tokens`` slots; waiters served by rank (see the module docstring)."""

    def __init__(self, total_tokens: int, reservation: Reservation = NO_RESERVATION) -> None:
        _check(total_tokens, reservation)
        self._total = total_tokens
        self._reservation = reservation
        # Borrower -> its priority.
        self._borrowers: dict[object, int] = {}
        self._capped_borrowed = 0
        # One heap per class (privileged: False, capped: True), so that the best waiter that
        # may take a freed slot is found at a heap's head.
        self._heaps: dict[bool, list[_Waiter]] = {False: [], True: []}
        self._waiting = {False: 0, True: 0}  # live entries of each heap
        self._serial = itertools.count()

    @property
    def total_tokens(self) -> int:
        return self._total

    @total_tokens.setter
    def total_tokens(self, value: int) -> None:
        self.resize(value, self._reservation)

    @property
    def reservation(self) -> Reservation:
        return self._reservation

    def resize(self, total_tokens: int, reservation: Reservation) -> None:
        """New sizes; borrowers above them keep their slots, and none is handed over until
        enough have been released."""
        _check(total_tokens, reservation)
        self._total = total_tokens
        if reservation != self._reservation:
            self._reservation = reservation
            self._capped_borrowed = sum(map(reservation.capped, self._borrowers.values()))
            waiters = [w for heap in self._heaps.values() for w in heap if w.live]
            self._heaps = {False: [], True: []}
            for waiter in waiters:
                waiter.capped = reservation.capped(waiter.priority)
                self._heaps[waiter.capped].append(waiter)
            for heap in self._heaps.values():
                heapq.heapify(heap)
            self._waiting = {capped: len(heap) for capped, heap in self._heaps.items()}
        self._hand_over()

    def statistics(self) -> LimiterStats:
        return LimiterStats(
            len(self._borrowers),
            self._waiting[False] + self._waiting[True],
            self._total,
            self._capped_borrowed,
            self._waiting[True],
        )

    def acquire_on_behalf_of_nowait(self, borrower: object, priority: int = 0) -> None:
        """A free slot for ``borrower``, or ``trio.WouldBlock``: none is free for its class, or
        someone who may take it waits."""
        if borrower in self._borrowers:
            raise RuntimeError("this borrower already holds one of this limiter's tokens")
        capped = self._reservation.capped(priority)
        # A privileged waiter waits only for a slot of any kind; a capped one may be waiting
        # for an unreserved slot only, which a privileged newcomer does not need.
        waiting = self._waiting[False] + (self._waiting[True] if capped else 0)
        if waiting or not self._may_take(capped):
            raise trio.WouldBlock
        self._grant(borrower, priority, capped)

    async def acquire_on_behalf_of(
        self, borrower: object, rank: float | None = None, priority: int = 0
    ) -> None:
        """A slot for ``borrower``, waiting in rank order (None: now, i.e. arrival order)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self.acquire_on_behalf_of_nowait(borrower, priority)
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        capped = self._reservation.capped(priority)
        waiter = _Waiter(
            rank=trio.current_time() if rank is None else rank,
            serial=next(self._serial),
            task=trio.lowlevel.current_task(),
            borrower=borrower,
            priority=priority,
            capped=capped,
        )
        heapq.heappush(self._heaps[capped], waiter)
        self._waiting[capped] += 1

        def abort(_: object) -> trio.lowlevel.Abort:
            # Runs synchronously at cancellation: no hand-over can reach this waiter after it.
            waiter.live = False
            self._waiting[waiter.capped] -= 1
            heap = self._heaps[waiter.capped]
            if len(heap) > 2 * self._waiting[waiter.capped] + _COMPACT_SLACK:
                heap[:] = [w for w in heap if w.live]
                heapq.heapify(heap)
            return trio.lowlevel.Abort.SUCCEEDED

        # _hand_over put the borrower in _borrowers before rescheduling us.
        await trio.lowlevel.wait_task_rescheduled(abort)

    def release_on_behalf_of(self, borrower: object) -> None:
        if borrower not in self._borrowers:
            raise RuntimeError("this borrower isn't holding any of this limiter's tokens")
        if self._reservation.capped(self._borrowers.pop(borrower)):
            self._capped_borrowed -= 1
        self._hand_over()

    def _may_take(self, capped: bool) -> bool:
        if len(self._borrowers) >= self._total:
            return False
        return not capped or self._capped_borrowed < self._total - self._reservation.slots

    def _grant(self, borrower: object, priority: int, capped: bool) -> None:
        self._borrowers[borrower] = priority
        self._capped_borrowed += capped

    def _head(self, capped: bool) -> _Waiter | None:
        heap = self._heaps[capped]
        while heap and not heap[0].live:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _hand_over(self) -> None:
        while True:
            # The best-ranked head of the classes that may take a slot now.
            heads = [
                w
                for capped in (False, True)
                if self._may_take(capped) and (w := self._head(capped))
            ]
            if not heads:
                return
            waiter = min(heads)
            heapq.heappop(self._heaps[waiter.capped])
            waiter.live = False
            self._waiting[waiter.capped] -= 1
            self._grant(waiter.borrower, waiter.priority, waiter.capped)
            trio.lowlevel.reschedule(waiter.task)


def _check(total_tokens: int, reservation: Reservation) -> None:
    if total_tokens < 0:
        raise ValueError("total_tokens must be >= 0")
    if reservation.slots < 0 or (reservation.slots and reservation.slots >= total_tokens):
        raise ValueError("a reservation must leave at least one slot to the capped class")
