"""SharedGate: one provider's slots leased in a real Redis by several gateway processes (here,
several LeaseBrokers with their own connections and process ids), including Redis failing.

Lease expiry is Redis's real time, so these tests wait real (short) times: a 0.6 s TTL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Literal

import coredis
import pytest
import trio
import trio.testing

from tests.redis_server import RedisServer, pause, resume, running_redis
from tests.unit.test_h1_client_tls import make_ca_and_server
from trio_gateway.capacity.gate import POLL_MAX_S, GateStats, LeaseBroker, SharedGate
from trio_gateway.redis.client import RedisError, open_redis

TTL_S = 0.6
TIMEOUT_S = 0.25
# For the tests about the limit, not about Redis failing: a Redis that answers late on a loaded
# machine (a CI run once took over 0.25 s) must not send the brokers into their fallback.
PATIENT_TIMEOUT_S = 5.0
PREFIX = "t:"
# Room for a loaded machine (another test run may share it) on top of the bound under test.
SLACK_S = 0.75


@asynccontextmanager
async def brokers(
    server: RedisServer,
    n: int,
    on_error: Literal["share", "refuse"] = "share",
    timeout_s: float = TIMEOUT_S,
) -> AsyncIterator[list[LeaseBroker]]:
    """``n`` gateway processes, each with its own Redis connections and process id."""
    async with AsyncExitStack() as stack:
        out = []
        for i in range(n):
            client = await stack.enter_async_context(open_redis(server.url))
            out.append(
                LeaseBroker(
                    client,
                    key_prefix=PREFIX,
                    lease_ttl_s=TTL_S,
                    timeout_s=timeout_s,
                    on_error=on_error,
                    process_id=f"p{i}",
                )
            )
        yield out


async def leases_in_redis(server: RedisServer, key: str) -> int:
    async with coredis.Redis(host="127.0.0.1", port=server.port) as raw:
        return await raw.zcard(f"{PREFIX}{{lease}}:{key}")


async def meet(gates: list[SharedGate]) -> None:
    """Every process heartbeats twice, so that each has seen all the others."""
    for _ in range(2):
        for gate in gates:
            me = object()
            assert await gate.try_acquire(me)
            await gate.release(me)


async def grant_times(gate: SharedGate, *, tries: int, patience_s: float) -> list[float]:
    """``tries`` concurrent acquires that each give up after ``patience_s``: how long each
    granted one took."""
    granted: list[float] = []
    started = trio.current_time()

    async def borrower() -> None:
        with trio.move_on_after(patience_s):
            await gate.acquire(object())
            granted.append(trio.current_time() - started)

    async with trio.open_nursery() as nursery:
        for _ in range(tries):
            nursery.start_soon(borrower)
    return granted


async def test_three_processes_never_exceed_the_limit_together() -> None:
    async with running_redis() as server, brokers(server, 3, timeout_s=PATIENT_TIMEOUT_S) as bs:
        gates = [b.gate("vllm", 8) for b in bs]
        holders = peak = served = 0
        counted: list[int] = []

        async def borrower(gate: SharedGate) -> None:
            nonlocal holders, peak, served
            me = object()
            await gate.acquire(me)
            try:
                holders += 1
                peak = max(peak, holders)
                assert gate.cluster_in_flight is not None
                counted.append(gate.cluster_in_flight)
                await trio.sleep(0.02)
            finally:
                holders -= 1
                await gate.release(me)
            served += 1

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for b in bs:
                    await nursery.start(b.serve)
                async with trio.open_nursery() as requests:
                    for i in range(60):
                        requests.start_soon(borrower, gates[i % 3])
                nursery.cancel_scope.cancel()
        assert served == 60
        # Each process alone allows 8: without the leases, up to 24 would hold at once.
        assert 2 <= peak <= 8
        assert max(counted) <= 8
        assert await leases_in_redis(server, "vllm") == 0
        assert [g.statistics() for g in gates] == [GateStats(0, 0, 8)] * 3
        assert sum(b.lost_leases for b in bs) == 0
        assert sum(b.errors for b in bs) == 0


async def test_a_killed_process_gives_its_slots_back_within_the_ttl() -> None:
    async with (
        running_redis() as server,
        brokers(server, 2, timeout_s=PATIENT_TIMEOUT_S) as (survivor, doomed),
    ):
        alive, dying = survivor.gate("vllm", 8), doomed.gate("vllm", 8)
        doomed_life = trio.CancelScope()

        async def doomed_process(*, task_status: trio.TaskStatus[None]) -> None:
            with doomed_life:
                async with trio.open_nursery() as nursery:
                    await nursery.start(doomed.serve)
                    for _ in range(8):
                        assert await dying.try_acquire(object())
                    task_status.started()
                    await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            await nursery.start(survivor.serve)
            await nursery.start(doomed_process)
            # Renewed, the leases outlive their TTL for as long as their process lives.
            await trio.sleep(2 * TTL_S)
            assert not await alive.try_acquire(object())
            assert doomed.lost_leases == 0
            # kill -9: no release, no renewal; its holders are simply abandoned.
            doomed_life.cancel()
            with trio.fail_after(TTL_S + POLL_MAX_S + SLACK_S):
                for _ in range(8):
                    await alive.acquire(object())
            assert alive.statistics().in_flight == 8
            assert alive.cluster_in_flight == 8
            nursery.cancel_scope.cancel()


async def test_redis_down_share_grants_a_share_of_the_limit_per_process() -> None:
    async with running_redis() as server, brokers(server, 3, "share") as bs:
        gates = [b.gate("vllm", 8) for b in bs]
        await meet(gates)
        assert [b.peers for b in bs] == [3, 3, 3]
        server.kill()

        for broker, gate in zip(bs, gates, strict=True):
            granted = await grant_times(gate, tries=5, patience_s=1.0)
            # 8 // 3 peers: two each, granted at once, and the waiters gave up at their deadline.
            assert len(granted) == 2
            assert max(granted) < TIMEOUT_S + SLACK_S
            assert gate.statistics() == GateStats(in_flight=2, waiting=0, max_inflight=8)
            assert broker.fallback_active()
            assert broker.errors > 0
            assert not gate.try_acquire_nowait(object())
            assert not await gate.try_acquire(object())


async def test_redis_down_refuse_grants_nothing() -> None:
    async with running_redis() as server, brokers(server, 1, "refuse") as (broker,):
        gate = broker.gate("vllm", 8)
        await meet([gate])
        server.kill()
        with trio.fail_after(TIMEOUT_S + SLACK_S):
            assert not await gate.try_acquire(object())
        assert not gate.try_acquire_nowait(object())
        with trio.move_on_after(1.0) as waited:
            await gate.acquire(object())
        assert waited.cancelled_caught
        assert gate.statistics() == GateStats(in_flight=0, waiting=0, max_inflight=8)
        assert broker.fallback_active()


async def test_a_paused_redis_costs_at_most_the_timeout() -> None:
    async with running_redis() as server, brokers(server, 2) as (share, refuse_):
        refuse_.on_error = "refuse"
        shared, refused = share.gate("vllm", 8), refuse_.gate("vllm", 8)
        held = object()
        assert await shared.try_acquire(held)
        pause(server)
        try:
            with trio.fail_after(TIMEOUT_S + SLACK_S):
                assert await shared.try_acquire(object())  # a fallback slot
            with trio.fail_after(TIMEOUT_S + SLACK_S):
                assert not await refused.try_acquire(object())
            errors = share.errors
            # A release in a cancelled request's cleanup: bounded, and it does not raise.
            with trio.fail_after(TIMEOUT_S + SLACK_S), trio.CancelScope() as request:
                request.cancel()
                await shared.release(held)
            assert share.errors == errors + 1
            assert shared.statistics().in_flight == 1
            # Renewal rounds fail and are skipped; serve itself goes on.
            async with trio.open_nursery() as nursery:
                await nursery.start(share.serve)
                await trio.sleep(2 * TTL_S)
                assert share.errors >= errors + 1 + 2
                nursery.cancel_scope.cancel()
        finally:
            resume(server)


async def test_leases_work_again_after_redis_restarts() -> None:
    async with running_redis() as server, brokers(server, 1) as (broker,):
        gate = broker.gate("vllm", 8)
        before = object()
        assert await gate.try_acquire(before)
        server.kill()
        fallback = object()
        with trio.fail_after(TIMEOUT_S + SLACK_S):
            assert await gate.try_acquire(fallback)
        assert broker.fallback_active()
        await server.start()  # same port, empty: the scripts and the leases are gone

        after = object()
        assert await gate.try_acquire(after)
        assert not broker.fallback_active()
        assert gate.cluster_in_flight == 1  # the fallback slot holds no lease
        assert await leases_in_redis(server, "vllm") == 1
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.serve)
            await trio.sleep(TTL_S)  # three renewal rounds
            nursery.cancel_scope.cancel()
        assert broker.lost_leases == 1  # the lease taken before the restart
        for who in (before, fallback, after):
            await gate.release(who)
        assert gate.statistics().in_flight == 0
        assert await leases_in_redis(server, "vllm") == 0


async def test_release_with_redis_down_returns_within_the_timeout() -> None:
    async with running_redis() as server, brokers(server, 1) as (broker,):
        gate = broker.gate("vllm", 2)
        held = object()
        assert await gate.try_acquire(held)
        server.kill()
        with trio.fail_after(TIMEOUT_S + SLACK_S):
            await gate.release(held)
        assert gate.statistics().in_flight == 0
        assert broker.errors == 1


async def test_cancel_while_waiting_for_a_lease_frees_the_local_slot() -> None:
    async with running_redis() as server, brokers(server, 2) as (a, b):
        full, other = a.gate("vllm", 2), b.gate("vllm", 2)
        holders = [object(), object()]
        for who in holders:
            assert await full.try_acquire(who)
        with trio.move_on_after(0.3) as waited:
            await other.acquire(object())
        assert waited.cancelled_caught
        assert other.statistics() == GateStats(in_flight=0, waiting=0, max_inflight=2)
        for who in holders:
            await full.release(who)
        # Both local slots are free again: nothing leaked by the cancelled wait.
        assert await other.try_acquire(object())
        assert await other.try_acquire(object())


async def wake_latency(mine: SharedGate, theirs: SharedGate) -> float:
    """How long after a local release a local waiter, polling Redis with its backoff at
    POLL_MAX_S, got the lease. Limit 2: one lease each, so the waiter has a local slot and
    waits in Redis, not in the local limiter."""
    blocker, holder, waiter = object(), object(), object()
    assert await theirs.try_acquire(blocker)
    assert await mine.try_acquire(holder)
    released_at = granted_at = 0.0

    async def wait() -> None:
        nonlocal granted_at
        await mine.acquire(waiter)
        granted_at = trio.current_time()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.sleep(4 * POLL_MAX_S)
        assert mine.statistics() == GateStats(in_flight=1, waiting=1, max_inflight=2)
        released_at = trio.current_time()
        await mine.release(holder)
    await mine.release(waiter)
    await theirs.release(blocker)
    return granted_at - released_at


async def test_a_local_release_wakes_a_waiter_without_the_poll_delay() -> None:
    async with running_redis() as server, brokers(server, 2) as (a, b):
        mine, theirs = a.gate("vllm", 2), b.gate("vllm", 2)
        async with trio.open_nursery() as nursery:
            for broker in (a, b):
                await nursery.start(broker.serve)  # the waits outlast TTL_S
            # Polling alone would take up to POLL_MAX_S, half of it on average: three in a
            # row under POLL_MAX_S / 2 would be chance once in eight.
            for _ in range(3):
                assert await wake_latency(mine, theirs) < POLL_MAX_S / 2
            nursery.cancel_scope.cancel()


async def test_an_uncontended_request_costs_two_round_trips() -> None:
    async with running_redis() as server, brokers(server, 1) as (broker,):
        gate = broker.gate("vllm", 8)
        await meet([gate])  # the scripts loaded
        before = broker.round_trips
        for _ in range(10):
            me = object()
            await gate.acquire(me)
            await gate.release(me)
        assert broker.round_trips - before == 20
        me = object()
        assert await gate.try_acquire(me)
        await gate.release(me)
        assert broker.round_trips - before == 22
        assert broker.errors == 0
        assert gate.cluster_in_flight == 0


async def test_the_same_key_is_the_same_gate_and_each_call_brings_its_limit() -> None:
    async with running_redis() as server, brokers(server, 2) as (broker, reloaded):
        key = "vllm@10.0.0.1:8000"
        gate = broker.gate(key, 2)
        assert broker.gate(key, 2) is gate
        assert broker.gate("other", 2) is not gate
        assert broker.gate(key, 3) is gate
        assert gate.statistics().max_inflight == 3
        for _ in range(3):
            assert await gate.try_acquire(object())
        assert not await gate.try_acquire(object())
        # Another process already reloaded to 4: its scripts compare with 4, ours with 3.
        assert await reloaded.gate(key, 4).try_acquire(object())
        assert gate.cluster_in_flight == 3
        assert reloaded.gate(key, 4).cluster_in_flight == 4
        broker.gate(key, 2)  # down: the 3 held stay, nothing new until below 2
        assert gate.statistics() == GateStats(in_flight=3, waiting=0, max_inflight=2)
        assert not await gate.try_acquire(object())


async def test_an_acquire_cancelled_mid_call_leaves_no_lease_behind() -> None:
    """A race for a slot cancels the losers (pipeline._first_slot): one cancelled after its
    script was sent but before the reply was read must not keep a cluster slot for lease_ttl_s.
    Cancelled at spread-out moments, 200 times: no lease is left, at once, not after the TTL."""
    async with running_redis() as server, brokers(server, 1) as (broker,):
        gate = broker.gate("vllm", 8)
        granted = 0
        for i in range(200):
            borrower = object()
            with trio.move_on_after(i * 0.00002):  # 0 to 4 ms: across the round trip
                await gate.acquire(borrower)
                granted += 1
                await gate.release(borrower)
            assert gate.statistics().in_flight == 0
        # Some were cancelled, some not: the deadlines spanned the whole call.
        assert 0 < granted < 200
        assert await leases_in_redis(server, "vllm") == 0


async def test_leases_over_tls_trust_the_ca_file_and_nothing_else(tmp_path: Path) -> None:
    """A managed Redis speaks TLS only (``rediss://``): its certificate is checked against
    ``[redis] ca_file`` and its name (SNI, ``localhost`` here)."""
    ca, _ = make_ca_and_server(tmp_path)
    tls = (str(tmp_path / "server.pem"), str(ca))
    (tmp_path / "other").mkdir()
    other, _ = make_ca_and_server(tmp_path / "other")
    async with running_redis(tls=tls) as server:
        assert server.url.startswith("rediss://localhost:")
        async with open_redis(server.url, ca_file=server.ca_file) as client:
            broker = LeaseBroker(
                client,
                key_prefix=PREFIX,
                lease_ttl_s=TTL_S,
                timeout_s=PATIENT_TIMEOUT_S,
                on_error="refuse",
            )
            gate = broker.gate("vllm", 1)
            first, second = object(), object()
            assert await gate.try_acquire(first)
            assert not await gate.try_acquire(second)
            await gate.release(first)
            assert broker.errors == 0
        async with open_redis(server.url, ca_file=str(other)) as client:
            with pytest.raises(RedisError, match="certificate verify failed"):
                await client.ping()
        plain = server.url.replace("rediss://", "redis://")
        async with open_redis(plain) as client:
            with pytest.raises(RedisError), trio.fail_after(5):
                await client.ping()
