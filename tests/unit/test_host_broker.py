"""The host broker (process/host_broker.py) and its workers' side (capacity/host_link.py,
host_gate.py, accounting/host_store.py) over real socketpairs, in one trio run: each link
stands for a worker. The workers' own processes are tests/e2e/test_workers_share.py."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import msgspec
import pytest
import trio
import trio.lowlevel
import trio.testing

from trio_gateway.accounting.admission import Limits
from trio_gateway.accounting.host_store import HostStore, Seed
from trio_gateway.accounting.limit_store import AdmitArgs, MemoryStore
from trio_gateway.capacity.gate import GateStats
from trio_gateway.capacity.host_gate import TRY_TIMEOUT_S, HostGate, HostGates
from trio_gateway.capacity.host_link import HostLink
from trio_gateway.capacity.host_slots import AcquireBody
from trio_gateway.capacity.slot_queue import NO_RESERVATION
from trio_gateway.core.budget_period import Period, period_of
from trio_gateway.core.errors import LimitsUnavailable
from trio_gateway.core.host_wire import GATE_ACQUIRE, encode_frame
from trio_gateway.core.keys import ApiKey
from trio_gateway.process import host_broker
from trio_gateway.process.host_broker import HostBroker

STEP_S = 5.0  # a bound for what takes microseconds: only a broken test waits this long


@asynccontextmanager
async def broker_and_links(
    nursery: trio.Nursery, count: int, store: MemoryStore | None = None, seed: Seed | None = None
) -> AsyncIterator[tuple[HostBroker, list[HostLink], list[socket.socket]]]:
    broker = HostBroker(store, seed)
    links, ends = [], []
    for _ in range(count):
        ours, theirs = socket.socketpair()
        await nursery.start(broker.serve_worker, ours)
        link = HostLink(theirs)
        await nursery.start(link.serve)
        links.append(link)
        ends.append(theirs)
    yield broker, links, ends


def gate_of(link: HostLink, max_inflight: int = 2) -> HostGate:
    return HostGates(link).gate("vllm", max_inflight, NO_RESERVATION)


async def until(predicate: object) -> None:
    with trio.fail_after(STEP_S):
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110 - no event
            await trio.sleep(0.001)


async def test_two_workers_share_the_slots_and_a_release_hands_one_over_in_rank_order() -> None:
    async with trio.open_nursery() as nursery, broker_and_links(nursery, 3) as (broker, links, _):
        a, b, c = (gate_of(link) for link in links)
        assert await a.try_acquire("a1")
        assert await b.try_acquire("b1")
        assert not await c.try_acquire("c1")
        served: list[str] = []

        async def wait(gate: HostGate, name: str, rank: float) -> None:
            await gate.acquire(name, rank)
            served.append(name)

        now = trio.current_time()
        # c asks first, but ranks later (a lower priority's aging): b's goes first.
        nursery.start_soon(wait, c, "c-late-rank", now + 10)
        await until(lambda: broker.slots.statistics("vllm").tasks_waiting == 1)  # type: ignore[union-attr]
        nursery.start_soon(wait, b, "b-early-rank", now)
        await until(lambda: broker.slots.statistics("vllm").tasks_waiting == 2)  # type: ignore[union-attr]
        await a.release("a1")
        await until(lambda: served == ["b-early-rank"])
        await b.release("b1")
        await until(lambda: served == ["b-early-rank", "c-late-rank"])
        assert (a.statistics().in_flight, b.statistics().in_flight) == (0, 1)
        assert c.host_in_flight == 2
        nursery.cancel_scope.cancel()


async def test_a_cancelled_wait_and_a_grant_it_crossed_leave_nothing_held() -> None:
    async with trio.open_nursery() as nursery, broker_and_links(nursery, 2) as (broker, links, _):
        a, b = gate_of(links[0], 1), gate_of(links[1], 1)
        assert await a.try_acquire("a")
        with trio.move_on_after(0.05):
            await b.acquire("b")
        assert b.statistics().waiting == 0
        await a.release("a")
        # b's release and a's hand-over crossed or not: the slot is free either way.
        await until(lambda: broker.slots.statistics("vllm") is None)
        assert await b.try_acquire("b2")
        nursery.cancel_scope.cancel()


async def test_a_worker_gone_gives_back_its_slots_to_the_other_at_once() -> None:
    async with trio.open_nursery() as nursery, broker_and_links(nursery, 2) as (_, links, ends):
        a, b = gate_of(links[0]), gate_of(links[1])
        assert await a.try_acquire("a1") and await a.try_acquire("a2")
        got = trio.Event()

        async def wait() -> None:
            await b.acquire("b")
            got.set()

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        ends[0].shutdown(socket.SHUT_RDWR)  # the worker's end closes, as at its exit
        with trio.fail_after(STEP_S):
            await got.wait()
        # Its link is closed: nothing more is asked of the broker.
        assert not await a.try_acquire("a3")
        nursery.cancel_scope.cancel()


async def test_a_broker_gone_refuses_tries_and_a_wait_lasts_until_its_deadline() -> None:
    async with trio.open_nursery() as nursery:
        ours, theirs = socket.socketpair()
        link = HostLink(theirs)
        await nursery.start(link.serve)
        ours.close()
        await until(lambda: link.closed)
        gate = gate_of(link)
        assert not await gate.try_acquire("x")
        with trio.move_on_after(0.05) as waited:
            await gate.acquire("y")
        assert waited.cancelled_caught
        limits = Limits(HostStore(link), timeout_s=0.05, fail_open=False, hold_ttl_s=60)
        with pytest.raises(LimitsUnavailable):
            await limits.admit(ApiKey(name="k", digest=b"0" * 32, rpm=1), {"messages": []}, ())
        nursery.cancel_scope.cancel()


def admit_args(hold_id: str, *, rpm: int | None = None, budget: int | None = None) -> AdmitArgs:
    return AdmitArgs(
        key="k", rpm=rpm, tpm=None, tokens=1, budget=budget, hold=5, hold_id=hold_id, ttl_s=60.0
    )


async def test_rate_limits_and_holds_are_the_brokers_and_a_worker_gone_drops_its_holds() -> None:
    store = MemoryStore()
    async with (
        trio.open_nursery() as nursery,
        broker_and_links(nursery, 2, store) as (_, links, ends),
    ):
        a, b = HostStore(links[0]), HostStore(links[1])
        results = [await s.admit(admit_args(f"h{i}", rpm=2)) for i, s in enumerate((a, b, a))]
        assert [r.refused for r in results] == [None, None, "rate"]
        assert (await a.admit(admit_args("ha", budget=12))).refused is None
        assert (await b.admit(admit_args("hb", budget=12))).refused is None
        assert (await b.admit(admit_args("hb2", budget=12))).refused == "budget"
        await b.settle("k", "hb", 3)
        await until(lambda: store.spent("k") == 3)
        ends[0].shutdown(socket.SHUT_RDWR)  # worker a gone: its hold stops counting now
        await until(lambda: store.held("k") == 0)
        assert store.spent("k") == 3
        nursery.cancel_scope.cancel()


async def test_a_period_s_spend_is_the_brokers_seeded_once_from_the_ledger() -> None:
    """Budgets per period through the broker: the broker's store learns a key's spend in its
    period from the ledger (the seed) before its first admission, settles in the request's
    period, and says what was spent (the status page, ``keys list``) to any worker."""
    store = MemoryStore()
    today = period_of("day", 1_796_600_000.0)
    seeded: list[tuple[str, Period]] = []

    async def seed(key: str, period: Period) -> None:
        if not store.knows(key, period):
            seeded.append((key, period))
            store.seed(key, period, 7)  # spent before the restart, as the ledger says

    async with (
        trio.open_nursery() as nursery,
        broker_and_links(nursery, 2, store, seed) as (_, links, _ends),
    ):
        a, b = HostStore(links[0]), HostStore(links[1])
        ask = attrs.evolve(admit_args("h1", budget=12), period=today)
        assert (await a.admit(ask)).available == 12 - 7 - 5
        assert (await b.admit(attrs.evolve(ask, hold_id="h2"))).refused == "budget"
        assert seeded == [("k", today)]
        await a.settle("k", "h1", 4, today)
        with trio.fail_after(STEP_S):
            while await b.spent_in("k", today) != 11:  # noqa: ASYNC110 - the broker's answer
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()


async def test_a_worker_sending_what_is_no_frame_is_cut_off_and_its_slots_freed() -> None:
    async with (
        trio.open_nursery() as nursery,
        broker_and_links(nursery, 2) as (broker, links, ends),
    ):
        a = gate_of(links[0])
        assert await a.try_acquire("a")
        ends[0].send(encode_frame(1, 99, b"\xc0"))  # no such method
        await until(lambda: broker.workers == 1 and links[0].closed)
        assert await gate_of(links[1]).try_acquire("b1")
        assert await gate_of(links[1]).try_acquire("b2")
        nursery.cancel_scope.cancel()


async def test_a_reload_that_grows_the_gate_lets_a_waiter_in_at_once() -> None:
    async with trio.open_nursery() as nursery, broker_and_links(nursery, 2) as (broker, links, _):
        gates = HostGates(links[0])
        a, b = gates.gate("vllm", 1, NO_RESERVATION), gate_of(links[1], 1)
        assert await a.try_acquire("a")
        got = trio.Event()

        async def wait() -> None:
            await b.acquire("b")
            got.set()

        nursery.start_soon(wait)
        await until(lambda: broker.slots.statistics("vllm").tasks_waiting == 1)  # type: ignore[union-attr]
        # Worker a reloads to 2 slots; nobody asks anything after it.
        assert gates.gate("vllm", 2, NO_RESERVATION) is a
        with trio.fail_after(STEP_S):
            await got.wait()
        nursery.cancel_scope.cancel()


async def test_a_try_at_a_broker_that_does_not_answer_is_refused_in_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        silent, theirs = socket.socketpair()  # nobody reads the broker's end
        link = HostLink(theirs)
        await nursery.start(link.serve)
        gate = gate_of(link)
        started = trio.current_time()
        assert not await gate.try_acquire("x")
        assert trio.current_time() - started == pytest.approx(TRY_TIMEOUT_S)
        assert gate.statistics() == GateStats(0, 0, 2)
        nursery.cancel_scope.cancel()
    silent.close()


async def test_only_a_waiting_ask_is_counted_waiting_not_a_try(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The queued gauge is what waits for a slot: a try (answered at once, LocalGate's never
    counts) is not, even while its answer is on the way; a waiting ask is, until answered."""
    async with trio.open_nursery() as nursery:
        silent, theirs = socket.socketpair()  # nobody reads the broker's end: asks stay asked
        link = HostLink(theirs)
        await nursery.start(link.serve)
        gate = gate_of(link)
        nursery.start_soon(gate.try_acquire, "try")
        await trio.testing.wait_all_tasks_blocked()
        assert gate.statistics() == GateStats(0, 0, 2)
        with trio.move_on_after(1.0):
            async with trio.open_nursery() as waiting:
                waiting.start_soon(gate.acquire, "wait", None)
                await trio.testing.wait_all_tasks_blocked()
                assert gate.statistics() == GateStats(0, 1, 2)
        assert gate.statistics() == GateStats(0, 0, 2)
        nursery.cancel_scope.cancel()
    silent.close()


async def test_a_worker_that_stops_reading_is_cut_off_at_the_unsent_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_broker, "MAX_UNSENT_BYTES", 4096)
    broker = HostBroker(None)
    ours, theirs = socket.socketpair()
    for sock, option in ((ours, socket.SO_SNDBUF), (theirs, socket.SO_RCVBUF)):
        sock.setsockopt(socket.SOL_SOCKET, option, 4096)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.serve_worker, ours)
        # Asks the broker answers at once (refused: the gate has no slot), never read.
        ask = msgspec.msgpack.encode(AcquireBody("vllm", 0, 0, 0, 0, 0.0, False))
        with trio.fail_after(STEP_S):
            call = 0
            while broker.workers:
                call += 1
                with contextlib.suppress(BlockingIOError, OSError):
                    theirs.send(encode_frame(call, GATE_ACQUIRE, ask))
                await trio.lowlevel.checkpoint()
        assert call > 100
    theirs.close()
