"""The host broker: in the supervisor of ``[server] workers``, the one place where the host's
workers take provider slots (without Redis leases) and pass budgets and rate limits (without
Redis), so that each limit holds across the workers as in one process.

Each worker gets one end of a Unix socketpair when it starts (``--broker-fd``); the broker
serves the other end (``serve_worker``) until it closes, which the kernel does the moment the
worker exits, however it exits: then every slot, wait and budget hold of that worker is given
back at once (the slots in ``HostSlots.drop``, the holds settled at no cost), and waiters of
other workers get the slots in their order. The supervisor also stops serving a worker's end
when it has reaped the worker, so the bound is the supervisor's own wake-up, not the socket.

The state is pure (``capacity/host_slots.py`` for the gates, the config's limit store for
budgets and rate limits); this module reads frames, applies them in order per worker, and
writes the answers, each without a task per request: a worker's frames are handled by that
worker's task, answers to other workers (a slot handed over) are written at once, and what a
socket does not take waits in a bounded buffer for that worker's writer.
"""

from __future__ import annotations

import itertools
import logging
import socket

import attrs
import trio

from trio_gateway.accounting.host_store import (
    Seed,
    WorkerHolds,
    answer_admit,
    answer_spent,
    apply_settle,
    release_holds,
)
from trio_gateway.accounting.limit_store import LimitStore
from trio_gateway.capacity.host_link import write_unsent
from trio_gateway.capacity.host_slots import (
    ACQUIRE_BODY,
    RELEASE_BODY,
    RESIZE_BODY,
    Answer,
    HostSlots,
    encode,
)
from trio_gateway.core.host_wire import (
    GATE_ACQUIRE,
    GATE_RELEASE,
    GATE_RESIZE,
    LIMITS_ADMIT,
    LIMITS_SETTLE,
    LIMITS_SPENT,
    REPLY,
    FrameError,
    FrameReader,
    encode_frame,
)

log = logging.getLogger("trio_gateway")

RECEIVE_BYTES = 65536
# Answers a worker has not read yet. A worker reads all the time; one that lets this much
# pile up is stuck, and is cut off (its slots are given back).
MAX_UNSENT_BYTES = 4 * 1024 * 1024


@attrs.define(eq=False)
class _Worker:
    number: int
    sock: socket.socket
    holds: WorkerHolds = attrs.field(factory=WorkerHolds)
    unsent: bytearray = attrs.field(factory=bytearray)
    has_unsent: trio.Event = attrs.field(factory=trio.Event)
    broken: str | None = None


class HostBroker:
    """The host's gates and (without Redis) limit store, for every worker."""

    def __init__(self, store: LimitStore | None, seed: Seed | None = None) -> None:
        # None: budgets and rate limits are in Redis, which every worker reaches itself.
        self.store = store
        self.seed = seed
        self.slots = HostSlots()
        self._workers: dict[int, _Worker] = {}
        self._numbers = itertools.count(1)

    @property
    def workers(self) -> int:
        return len(self._workers)

    async def serve_worker(
        self, sock: socket.socket, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve one worker's end until it closes (or this is cancelled: the worker was
        reaped); then give back all it held."""
        sock.setblocking(False)
        worker = _Worker(next(self._numbers), sock)
        self._workers[worker.number] = worker
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_unsent, worker)
                task_status.started()
                await self._read(worker)
                nursery.cancel_scope.cancel()
        finally:
            if worker.broken is not None:
                log.error("host broker: worker %d %s; cut off", worker.number, worker.broken)
            del self._workers[worker.number]
            sock.close()
            self._answer(self.slots.drop(worker.number))
            if self.store is not None:
                with trio.CancelScope(shield=True):
                    await release_holds(self.store, worker.holds)

    async def _read(self, worker: _Worker) -> None:
        reader = FrameReader()
        while True:
            await trio.lowlevel.wait_readable(worker.sock)
            try:
                data = worker.sock.recv(RECEIVE_BYTES)
            except BlockingIOError:
                continue
            except OSError:
                return
            if not data:
                return
            try:
                frames = reader.feed(data)
                for frame in frames:
                    await self._handle(worker, frame.call, frame.method, bytes(frame.body))
            except (FrameError, ValueError) as exc:
                log.error("host broker: worker %d sent %s; cutting it off", worker.number, exc)
                return

    async def _handle(self, worker: _Worker, call: int, method: int, body: bytes) -> None:
        if method == GATE_ACQUIRE:
            ask = ACQUIRE_BODY.decode(body)
            rank = trio.current_time() + ask.rank_in_s
            self._answer(self.slots.acquire(worker.number, call, ask, rank))
        elif method == GATE_RELEASE:
            self._answer(self.slots.release(worker.number, RELEASE_BODY.decode(body)))
        elif method == GATE_RESIZE:
            self._answer(self.slots.resize(RESIZE_BODY.decode(body)))
        elif method in (LIMITS_ADMIT, LIMITS_SETTLE, LIMITS_SPENT) and self.store is not None:
            try:
                if method == LIMITS_SPENT:
                    self._send(worker, call, await answer_spent(self.store, body))
                elif method == LIMITS_ADMIT:
                    self._send(
                        worker, call, await answer_admit(self.store, worker.holds, body, self.seed)
                    )
                else:
                    await apply_settle(self.store, worker.holds, body)
            except (FrameError, ValueError):
                raise  # not a frame of ours: the worker is cut off
            except Exception:
                # The store's own failure is no reason to stop serving the host: the worker's
                # admission gets no answer, and its deadline answers 503 limits_unavailable.
                log.exception("host broker: the limit store failed")
        else:
            raise FrameError(f"a frame of method {method}, which this broker does not serve")

    def _answer(self, answers: list[Answer]) -> None:
        for answer in answers:
            worker = self._workers.get(answer.worker)
            if worker is not None:
                self._send(worker, answer.call, encode(answer.reply))

    def _send(self, worker: _Worker, call: int, body: bytes) -> None:
        frame = encode_frame(call, REPLY, body)
        if not worker.unsent:
            try:
                sent = worker.sock.send(frame)
            except BlockingIOError:
                sent = 0
            except OSError:
                return  # its reader sees the end and gives back what it held
            frame = frame[sent:]
            if not frame:
                return
        if len(worker.unsent) + len(frame) > MAX_UNSENT_BYTES:
            worker.broken = f"has not read {MAX_UNSENT_BYTES} bytes of answers"
            worker.sock.shutdown(socket.SHUT_RDWR)  # wakes its reader
            return
        worker.unsent += frame
        worker.has_unsent.set()

    async def _write_unsent(self, worker: _Worker) -> None:
        while True:
            await worker.has_unsent.wait()
            worker.has_unsent = trio.Event()
            if not await write_unsent(worker.sock, worker.unsent):
                return  # its reader sees the end and gives back what it held
