"""A provider's gate shared by the workers of one host, without Redis: every slot is asked of the
supervisor's host broker (``process/host_broker.py``; its queue is ``host_slots.py``), so
``max_inflight``, ``reserved_slots``, the rank order of waiters and their queue timeout hold
across the host's workers as in one process.

An ask is one round trip on a local socket (``host_link.py``); a release is one write, not
waited on. A worker that dies, even by SIGKILL, has its slots given back as soon as the
supervisor sees its end of the socket close (docs/deployment.md says how soon). Cancellation
is checked before the ask; cancelled while asking or waiting, the worker tells the broker to
drop the ask, and a slot it was granted meanwhile is freed by the same message.
"""

from __future__ import annotations

import trio

from trio_gateway.capacity.gate import GateStats
from trio_gateway.capacity.host_link import HostLink, HostLinkClosed
from trio_gateway.capacity.host_slots import ACQUIRE_REPLY, AcquireBody, ResizeBody, encode
from trio_gateway.capacity.slot_queue import NO_RESERVATION, Reservation
from trio_gateway.core.errors import Overloaded
from trio_gateway.core.host_wire import GATE_ACQUIRE, GATE_RELEASE, GATE_RESIZE

# The broker answers in microseconds; a try is bounded all the same (a waiting ask is bounded by
# its caller's queue timeout), generously: the wait is on the worker's clock, which an arrival
# storm puts seconds behind.
TRY_TIMEOUT_S = 10.0


class HostGate:
    """One provider's slots on this host; made by ``HostGates.gate``."""

    def __init__(
        self, link: HostLink, key: str, max_inflight: int, reservation: Reservation
    ) -> None:
        self.key = key
        self.max_inflight = max_inflight
        self.reservation = reservation
        # The host's count for this gate, as the broker's last answer gave it.
        self.host_in_flight: int | None = None
        self.host_waiting: int | None = None
        self._link = link
        self._held: dict[object, int] = {}  # borrower -> the call that got its slot
        self._waiting = 0

    def try_acquire_nowait(self, borrower: object, priority: int = 0) -> bool:
        """Without a round trip nothing can be granted: use ``try_acquire``."""
        return False

    async def try_acquire(self, borrower: object, priority: int = 0) -> bool:
        """A free slot, if the host has one for ``priority`` and nobody who may take it waits.
        A broker that does not answer within ``TRY_TIMEOUT_S`` has none."""
        with trio.move_on_after(TRY_TIMEOUT_S):
            return await self._ask(borrower, 0.0, priority, wait=False)
        return False

    async def acquire(self, borrower: object, rank: float | None = None, priority: int = 0) -> None:
        """A slot, waiting in rank order with every worker's waiters."""
        rank_in_s = 0.0 if rank is None else rank - trio.current_time()
        if not await self._ask(borrower, rank_in_s, priority, wait=True):
            raise Overloaded(
                f"{self.key}: this worker has too many requests at the host broker",
                provider=self.key.partition("@")[0],
            )

    def release_nowait(self, borrower: object) -> None:
        """Give the slot back: one write, no schedule point (the router's usual release)."""
        call = self._held.pop(borrower, None)
        if call is not None:
            self._link.post(GATE_RELEASE, encode(call))

    async def release(self, borrower: object) -> None:
        self.release_nowait(borrower)
        # A schedule point that cannot raise Cancelled: release runs in `finally` blocks.
        await trio.lowlevel.cancel_shielded_checkpoint()

    def resize(self, max_inflight: int, reservation: Reservation = NO_RESERVATION) -> None:
        """New sizes (a reload): told to the broker now, so that waiters a larger gate lets in
        go at once, and sent with every ask from now on."""
        if (max_inflight, reservation) == (self.max_inflight, self.reservation):
            return
        self.max_inflight = max_inflight
        self.reservation = reservation
        size = ResizeBody(self.key, max_inflight, reservation.slots, reservation.max_priority)
        self._link.post(GATE_RESIZE, encode(size))

    def statistics(self) -> GateStats:
        """This worker's part: its requests holding a slot, and waiting for one."""
        return GateStats(len(self._held), self._waiting, self.max_inflight)

    async def _ask(self, borrower: object, rank_in_s: float, priority: int, *, wait: bool) -> bool:
        if borrower in self._held:
            raise RuntimeError("this borrower already holds a slot of this gate")
        link = self._link
        call = link.new_call()
        reservation = self.reservation
        body = encode(
            AcquireBody(
                self.key,
                self.max_inflight,
                reservation.slots,
                reservation.max_priority,
                priority,
                rank_in_s,
                wait,
            )
        )
        # Only a waiting ask is queued (the gauge): a try is answered at once, as LocalGate's.
        queued = 1 if wait else 0
        self._waiting += queued
        try:
            raw = await link.call(call, GATE_ACQUIRE, body)
        except trio.Cancelled:
            # Granted or not, waiting or not: this drops it (host_slots.py).
            link.post(GATE_RELEASE, encode(call))
            raise
        except HostLinkClosed:
            if wait:
                # Nothing can be granted any more: wait for the caller's deadline.
                await trio.sleep_forever()
            return False
        finally:
            self._waiting -= queued
        reply = ACQUIRE_REPLY.decode(raw)
        self.host_in_flight, self.host_waiting = reply.in_flight, reply.waiting
        if reply.granted:
            self._held[borrower] = call
        return reply.granted


class HostGates:
    """This worker's host gates, one per key: a reload that keeps a provider keeps its gate
    (and its waiters), resized."""

    def __init__(self, link: HostLink) -> None:
        self.link = link
        self._gates: dict[str, HostGate] = {}

    def gate(self, key: str, max_inflight: int, reservation: Reservation) -> HostGate:
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = HostGate(self.link, key, max_inflight, reservation)
        else:
            gate.resize(max_inflight, reservation)
        return gate
