"""The host broker's gates, pure: one ``SlotQueue`` per provider gate, shared by every worker of
a host (``[server] workers``), and which worker's request holds or waits for which slot.

A worker asks for a slot with ``GATE_ACQUIRE`` (core/host_wire.py) and names, in every ask,
the gate's ``max_inflight`` and reservation as its config has them (workers reloading to other
sizes disagree only until the last has reloaded: the latest ask, or ``GATE_RESIZE`` a worker
sends when a reload changed them, resizes) and where it waits:
its rank as seconds from now (``rank_in_s``: the router's ``priority x priority_aging_s``,
less what the request already waited), which the broker turns into a rank on its own clock.
So the waiters of every worker are one queue, in one order, as in one process.

A request is named by its worker and the call number of its ask; ``GATE_RELEASE`` of that
number gives back its slot, or ends its wait, whichever it is at when the release arrives (a
worker that stopped waiting may cross a grant on the wire: the release frees that slot). A
worker whose connection ends has all its slots and waits dropped at once (``drop``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import attrs
import msgspec

from trio_gateway.capacity.slot_queue import LimiterStats, Reservation, SlotQueue, Waiter

# Slots held and asks waiting of one worker, together. Each is a request of its own in flight
# (two descriptors at least), so this is far above what a process can hold; past it the
# worker is refused rather than the broker's memory growing.
MAX_REQUESTS_PER_WORKER = 100_000

Ref = tuple[int, int]  # (worker, call)


class AcquireBody(msgspec.Struct, array_like=True, frozen=True):
    gate: str
    max_inflight: int
    reserved_slots: int
    reserved_max_priority: int
    priority: int
    rank_in_s: float
    wait: bool


class ResizeBody(msgspec.Struct, array_like=True, frozen=True):
    gate: str
    max_inflight: int
    reserved_slots: int
    reserved_max_priority: int


class AcquireReply(msgspec.Struct, array_like=True, frozen=True):
    granted: bool
    in_flight: int  # the gate's slots held on the host, after this answer
    waiting: int  # asks waiting for the gate on the host


ACQUIRE_BODY = msgspec.msgpack.Decoder(AcquireBody)
ACQUIRE_REPLY = msgspec.msgpack.Decoder(AcquireReply)
RELEASE_BODY = msgspec.msgpack.Decoder(int)
RESIZE_BODY = msgspec.msgpack.Decoder(ResizeBody)
encode = msgspec.msgpack.Encoder().encode


@attrs.frozen
class Answer:
    """What one worker's ask is told: ``reply`` for ``worker``'s ``call``."""

    worker: int
    call: int
    reply: AcquireReply


class HostSlots:
    """Every gate of the host, and the requests of every worker."""

    def __init__(self, max_requests_per_worker: int = MAX_REQUESTS_PER_WORKER) -> None:
        self.max_requests_per_worker = max_requests_per_worker
        self._gates: dict[str, SlotQueue] = {}
        # worker -> call -> (gate, its waiter while it waits; None once it holds a slot)
        self._requests: dict[int, dict[int, tuple[str, Waiter | None]]] = {}

    def statistics(self, gate: str) -> LimiterStats | None:
        queue = self._gates.get(gate)
        return None if queue is None else queue.statistics()

    def requests_of(self, worker: int) -> int:
        return len(self._requests.get(worker, ()))

    def acquire(self, worker: int, call: int, ask: AcquireBody, rank: float) -> list[Answer]:
        """The answers ``ask`` makes: to itself unless it waits (granted now, or refused: full
        and ``ask.wait`` false, or the worker over its bound), and to waiters a resize let in."""
        requests = self._requests.setdefault(worker, {})
        reservation = Reservation(ask.reserved_slots, ask.reserved_max_priority)
        queue = self._gates.get(ask.gate)
        answers: list[Answer] = []
        if queue is None:
            queue = self._gates[ask.gate] = SlotQueue(ask.max_inflight, reservation)
        elif (queue.total_tokens, queue.reservation) != (ask.max_inflight, reservation):
            answers += self._granted(ask.gate, queue.resize(ask.max_inflight, reservation))
        ref = (worker, call)
        if call in requests or len(requests) >= self.max_requests_per_worker:
            answers.append(Answer(worker, call, self._reply(queue, False)))
        elif queue.take_nowait(ref, ask.priority):
            requests[call] = (ask.gate, None)
            answers.append(Answer(worker, call, self._reply(queue, True)))
        elif ask.wait:
            requests[call] = (ask.gate, queue.enqueue(ref, rank, ask.priority, ref))
        else:
            answers.append(Answer(worker, call, self._reply(queue, False)))
        return answers

    def resize(self, size: ResizeBody) -> list[Answer]:
        """A worker reloaded a gate's sizes: applied at once (not only at its next ask), so
        waiters a larger gate lets in are answered now. A gate nobody holds or waits for has
        no state to resize: the next ask brings its sizes."""
        queue = self._gates.get(size.gate)
        reservation = Reservation(size.reserved_slots, size.reserved_max_priority)
        if queue is None or (queue.total_tokens, queue.reservation) == (
            size.max_inflight,
            reservation,
        ):
            return []
        return self._granted(size.gate, queue.resize(size.max_inflight, reservation))

    def release(self, worker: int, call: int) -> list[Answer]:
        """``worker``'s request ``call`` gives back its slot, or stops waiting; the answers to
        waiters that got the slot. An unknown call (refused, or released already) is nothing."""
        entry = self._requests.get(worker, {}).pop(call, None)
        if entry is None:
            return []
        return self._let_go(worker, call, *entry)

    def drop(self, worker: int) -> list[Answer]:
        """``worker`` is gone (its connection ended): every slot and wait of its, given back."""
        answers: list[Answer] = []
        requests = self._requests.pop(worker, {})
        # Its waits first: a slot it frees must not go to a wait of its own.
        for call, (gate, waiter) in sorted(requests.items(), key=lambda r: r[1][1] is None):
            answers += self._let_go(worker, call, gate, waiter)
        return answers

    def _let_go(self, worker: int, call: int, gate: str, waiter: Waiter | None) -> list[Answer]:
        queue = self._gates[gate]
        if waiter is not None:
            queue.cancel(waiter)
            answers = []
        else:
            answers = self._granted(gate, queue.release((worker, call)))
        stats = queue.statistics()
        if stats.borrowed_tokens == 0 and stats.tasks_waiting == 0:
            del self._gates[gate]  # a gate a reload removed leaves nothing behind
        return answers

    def _granted(self, gate: str, waiters: Iterable[Waiter]) -> list[Answer]:
        answers = []
        queue = self._gates[gate]
        for waiter in waiters:
            worker, call = cast(Ref, waiter.borrower)
            self._requests[worker][call] = (gate, None)
            answers.append(Answer(worker, call, self._reply(queue, True)))
        return answers

    @staticmethod
    def _reply(queue: SlotQueue, granted: bool) -> AcquireReply:
        stats = queue.statistics()
        return AcquireReply(granted, stats.borrowed_tokens, stats.tasks_waiting)
