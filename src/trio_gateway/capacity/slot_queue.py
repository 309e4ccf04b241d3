"""The state of a priority limiter, pure: who holds a slot, who waits in which order, and whom
a freed slot goes to. No I/O, no clock, no task.

Two shells drive it: ``PriorityLimiter`` (priority.py), whose waiters are trio tasks of one
process, and the supervisor's host broker (``process/host_broker.py``, through
``host_slots.HostSlots``), whose waiters are requests of its workers. The rules (the rank
order, the reservation, the hand-over) are priority.py's module docstring; they are written
once, here.

Every call that can free a slot (``release``, ``resize``) returns the waiters it granted one,
in the order granted: the shell wakes them. A waiter granted a slot is already a holder when it
is returned, so a free slot and a waiter who may take it never coexist, whatever the shell does
before it gets to them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import attrs

__all__ = ["NO_RESERVATION", "LimiterStats", "Reservation", "SlotQueue", "Waiter"]

# Dead entries (cancelled waiters) are dropped from the heap once they outnumber the live ones
# (plus this slack, so a small queue is not rebuilt at every cancellation).
_COMPACT_SLACK = 16
_NONE: tuple[Waiter, ...] = ()


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


@attrs.define(eq=False, slots=True)
class Waiter:
    rank: float
    serial: int  # arrival order: FIFO among equal ranks
    borrower: object
    priority: int
    capped: bool  # of the reservation in force (a resize may change it)
    token: object  # whom the shell tells: a task, a worker's request
    live: bool = True

    def __lt__(self, other: Waiter) -> bool:
        return (self.rank, self.serial) < (other.rank, other.serial)


class SlotQueue:
    """``total_tokens`` slots; waiters served by rank, lowest first, FIFO within a rank."""

    def __init__(self, total_tokens: int, reservation: Reservation = NO_RESERVATION) -> None:
        check(total_tokens, reservation)
        self.total_tokens = total_tokens
        self.reservation = reservation
        # Borrower -> its priority.
        self._borrowers: dict[object, int] = {}
        self._capped_borrowed = 0
        # One heap per class (privileged: False, capped: True), so that the best waiter that
        # may take a freed slot is found at a heap's head.
        self._heaps: dict[bool, list[Waiter]] = {False: [], True: []}
        self._waiting = {False: 0, True: 0}  # live entries of each heap
        self._serial = itertools.count()

    def holds(self, borrower: object) -> bool:
        return borrower in self._borrowers

    def statistics(self) -> LimiterStats:
        return LimiterStats(
            len(self._borrowers),
            self._waiting[False] + self._waiting[True],
            self.total_tokens,
            self._capped_borrowed,
            self._waiting[True],
        )

    def take_nowait(self, borrower: object, priority: int = 0) -> bool:
        """A free slot for ``borrower``; False when none is free for its class, or someone who
        may take it waits (a newcomer never goes before a waiter)."""
        if borrower in self._borrowers:
            raise RuntimeError("this borrower already holds one of this limiter's tokens")
        capped = self.reservation.capped(priority)
        # A privileged waiter waits only for a slot of any kind; a capped one may be waiting
        # for an unreserved slot only, which a privileged newcomer does not need.
        waiting = self._waiting[False] + (self._waiting[True] if capped else 0)
        if waiting or not self._may_take(capped):
            return False
        self._borrowers[borrower] = priority
        self._capped_borrowed += capped
        return True

    def enqueue(self, borrower: object, rank: float, priority: int, token: object) -> Waiter:
        """Queue ``borrower`` (after a ``take_nowait`` that failed): its ``Waiter``, which a
        later ``release`` or ``resize`` returns once granted, or which ``cancel`` removes."""
        if borrower in self._borrowers:
            raise RuntimeError("this borrower already holds one of this limiter's tokens")
        capped = self.reservation.capped(priority)
        waiter = Waiter(rank, next(self._serial), borrower, priority, capped, token)
        heapq.heappush(self._heaps[capped], waiter)
        self._waiting[capped] += 1
        return waiter

    def cancel(self, waiter: Waiter) -> None:
        """``waiter`` leaves the queue (it was not granted: a granted one is a holder, to be
        released)."""
        if not waiter.live:
            return
        waiter.live = False
        self._waiting[waiter.capped] -= 1
        heap = self._heaps[waiter.capped]
        if len(heap) > 2 * self._waiting[waiter.capped] + _COMPACT_SLACK:
            heap[:] = [w for w in heap if w.live]
            heapq.heapify(heap)

    def release(self, borrower: object) -> Sequence[Waiter]:
        """``borrower`` gives its slot back; the waiters granted one, in order."""
        try:
            priority = self._borrowers.pop(borrower)
        except KeyError:
            raise RuntimeError("this borrower isn't holding any of this limiter's tokens") from None
        if self.reservation.capped(priority):
            self._capped_borrowed -= 1
        return self._hand_over()

    def resize(self, total_tokens: int, reservation: Reservation) -> Sequence[Waiter]:
        """New sizes; borrowers above them keep their slots, and none is handed over until
        enough have been released. The waiters granted a slot by a larger size, in order."""
        check(total_tokens, reservation)
        self.total_tokens = total_tokens
        if reservation != self.reservation:
            self.reservation = reservation
            self._capped_borrowed = sum(map(reservation.capped, self._borrowers.values()))
            waiters = [w for heap in self._heaps.values() for w in heap if w.live]
            self._heaps = {False: [], True: []}
            for waiter in waiters:
                waiter.capped = reservation.capped(waiter.priority)
                self._heaps[waiter.capped].append(waiter)
            for heap in self._heaps.values():
                heapq.heapify(heap)
            self._waiting = {capped: len(heap) for capped, heap in self._heaps.items()}
        return self._hand_over()

    def _may_take(self, capped: bool) -> bool:
        if len(self._borrowers) >= self.total_tokens:
            return False
        return not capped or self._capped_borrowed < self.total_tokens - self.reservation.slots

    def _head(self, capped: bool) -> Waiter | None:
        heap = self._heaps[capped]
        while heap and not heap[0].live:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _hand_over(self) -> Sequence[Waiter]:
        if not (self._waiting[False] or self._waiting[True]):
            return _NONE  # the usual release: nobody waits
        granted: list[Waiter] = []
        while True:
            # The best-ranked head of the classes that may take a slot now.
            heads = [
                w
                for capped in (False, True)
                if self._may_take(capped) and (w := self._head(capped))
            ]
            if not heads:
                return granted
            waiter = min(heads)
            heapq.heappop(self._heaps[waiter.capped])
            waiter.live = False
            self._waiting[waiter.capped] -= 1
            self._borrowers[waiter.borrower] = waiter.priority
            self._capped_borrowed += waiter.capped
            granted.append(waiter)


def check(total_tokens: int, reservation: Reservation) -> None:
    if total_tokens < 0:
        raise ValueError("total_tokens must be >= 0")
    if reservation.slots < 0 or (reservation.slots and reservation.slots >= total_tokens):
        raise ValueError("a reservation must leave at least one slot to the capped class")
