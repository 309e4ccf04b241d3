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

The state and these rules are ``slot_queue.SlotQueue`` (pure); this module wakes trio tasks
with it. The supervisor's host broker serves its workers with the same queue
(``host_slots.py``), so the order holds across a host's workers as in one process.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from trio_gateway.capacity.slot_queue import (
    NO_RESERVATION,
    LimiterStats,
    Reservation,
    SlotQueue,
    Waiter,
)

__all__ = ["NO_RESERVATION", "LimiterStats", "PriorityLimiter", "Reservation"]


class PriorityLimiter:
    """``total_tokens`` slots; waiters served by rank (see the module docstring)."""

    def __init__(self, total_tokens: int, reservation: Reservation = NO_RESERVATION) -> None:
        self._queue = SlotQueue(total_tokens, reservation)

    @property
    def total_tokens(self) -> int:
        return self._queue.total_tokens

    @total_tokens.setter
    def total_tokens(self, value: int) -> None:
        self.resize(value, self._queue.reservation)

    @property
    def reservation(self) -> Reservation:
        return self._queue.reservation

    def resize(self, total_tokens: int, reservation: Reservation) -> None:
        """New sizes; borrowers above them keep their slots, and none is handed over until
        enough have been released."""
        _wake(self._queue.resize(total_tokens, reservation))

    def statistics(self) -> LimiterStats:
        return self._queue.statistics()

    def acquire_on_behalf_of_nowait(self, borrower: object, priority: int = 0) -> None:
        """A free slot for ``borrower``, or ``trio.WouldBlock``: none is free for its class, or
        someone who may take it waits."""
        if not self._queue.take_nowait(borrower, priority):
            raise trio.WouldBlock

    async def acquire_on_behalf_of(
        self, borrower: object, rank: float | None = None, priority: int = 0
    ) -> None:
        """A slot for ``borrower``, waiting in rank order (None: now, i.e. arrival order)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        queue = self._queue
        if queue.take_nowait(borrower, priority):
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = queue.enqueue(
            borrower,
            trio.current_time() if rank is None else rank,
            priority,
            trio.lowlevel.current_task(),
        )

        def abort(_: object) -> trio.lowlevel.Abort:
            # Runs synchronously at cancellation: no hand-over can reach this waiter after it.
            queue.cancel(waiter)
            return trio.lowlevel.Abort.SUCCEEDED

        # The hand-over made the borrower a holder before rescheduling us.
        await trio.lowlevel.wait_task_rescheduled(abort)

    def release_on_behalf_of(self, borrower: object) -> None:
        _wake(self._queue.release(borrower))


def _wake(granted: Sequence[Waiter]) -> None:
    for waiter in granted:
        task = waiter.token
        assert isinstance(task, trio.lowlevel.Task)
        trio.lowlevel.reschedule(task)
