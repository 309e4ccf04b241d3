"""SharedGate and LeaseBroker against a Redis whose lease scripts answer what each test says,
on a mock clock: the fallback share, the poll backoff, the renewal cadence, what a cancelled
attempt gives back (mutation testing, docs/testing.md). The scripts themselves run against a
real Redis in tests/e2e/test_gate_redis.py."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import cast

import pytest
import trio
import trio.testing

from trio_gateway.capacity.gate import (
    ACQUIRE_SCRIPT,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
    LeaseBroker,
    SharedGate,
    _parse,
)
from trio_gateway.redis.client import RedisClient, RedisError, Value

Reply = Callable[[list[str], list[Value]], object]


class _Redis:
    """Lease scripts answered by ``acquire``, ``release`` and ``renew``; every call that got
    through is recorded with its time. ``down``: every call fails."""

    def __init__(self) -> None:
        self.down = False
        self.acquire: Reply = lambda keys, args: [1, 1, 1]
        self.release: Reply = lambda keys, args: [0]
        self.renew: Reply = lambda keys, args: [1, -1]
        self.calls: list[tuple[str, float, list[Value]]] = []

    async def run_script(self, source: str, keys: Sequence[str], args: Sequence[Value]) -> object:
        await trio.lowlevel.checkpoint()
        if self.down:
            raise RedisError("redis connection failed: refused")
        name, reply = {
            ACQUIRE_SCRIPT: ("acquire", self.acquire),
            RELEASE_SCRIPT: ("release", self.release),
            RENEW_SCRIPT: ("renew", self.renew),
        }[source]
        self.calls.append((name, trio.current_time(), list(args)))
        return reply(list(keys), list(args))

    def named(self, name: str) -> list[tuple[str, float, list[Value]]]:
        return [call for call in self.calls if call[0] == name]


def _broker(redis: _Redis, on_error: str = "share", lease_ttl_s: float = 3.0) -> LeaseBroker:
    return LeaseBroker(
        cast(RedisClient, redis),
        key_prefix="t:",
        lease_ttl_s=lease_ttl_s,
        timeout_s=1.0,
        on_error=on_error,  # type: ignore[arg-type]
        process_id="p",
    )


def _borrowed(gate: SharedGate) -> int:
    return int(gate._limiter.statistics().borrowed_tokens)


def test_procs_is_no_gate_s_key() -> None:
    broker = _broker(_Redis())
    with pytest.raises(ValueError) as caught:
        broker.gate("procs", 1)
    assert str(caught.value) == "'procs': procs and capped:* are the gateway's own lease keys"
    with pytest.raises(ValueError) as capped:
        broker.gate("capped:g", 1)
    assert str(capped.value) == "'capped:g': procs and capped:* are the gateway's own lease keys"
    assert broker.gate("PROCS", 1).key == "PROCS"
    assert broker.gate("g-capped:", 1).key == "g-capped:"


async def test_renewal_reads_the_peers_and_the_cluster_count() -> None:
    redis = _Redis()
    broker = _broker(redis)
    gate = broker.gate("g", 4)
    redis.acquire = lambda keys, args: [1, 1, 3]
    assert await gate.try_acquire(object())
    assert broker.peers == 3
    redis.renew = lambda keys, args: [1, 5]
    await broker._renew()
    assert broker.peers == 1 and gate.cluster_in_flight == 5


async def test_an_acquire_reads_the_peers_down_to_one() -> None:
    redis = _Redis()
    broker = _broker(redis)
    gate = broker.gate("g", 4)
    redis.acquire = lambda keys, args: [1, 1, 3]
    assert await gate.try_acquire(object())
    redis.acquire = lambda keys, args: [1, 2, 1]
    assert await gate.try_acquire(object())
    assert broker.peers == 1 and gate.cluster_in_flight == 2


async def test_each_lost_lease_is_counted() -> None:
    redis = _Redis()
    broker = _broker(redis)
    gate = broker.gate("g", 4)
    assert await gate.try_acquire(object()) and await gate.try_acquire(object())
    members = [str(call[2][0]) for call in redis.named("acquire")]
    redis.renew = lambda keys, args: [1, 0, *members]
    await broker._renew()
    assert broker.lost_leases == 2


async def test_renewals_keep_a_fixed_cadence(autojump_clock: trio.testing.MockClock) -> None:
    redis = _Redis()
    broker = _broker(redis, lease_ttl_s=3.0)
    with trio.move_on_after(4.5):
        await broker.serve()
    assert [t for _, t, _ in redis.named("renew")] == [0.0, 1.0, 2.0, 3.0, 4.0]


async def test_a_fallback_slot_is_a_share_of_the_limit_and_has_no_lease() -> None:
    redis = _Redis()
    broker = _broker(redis)
    gate = broker.gate("g", 8)
    redis.acquire = lambda keys, args: [1, 1, 4]  # 4 processes: a share of 2
    first = object()
    assert await gate.try_acquire(first)
    redis.down = True
    await broker._renew()  # fails: the fallback is on
    assert broker.fallback_active()
    second, third = object(), object()
    assert gate.try_acquire_nowait(second)
    assert _borrowed(gate) == 2
    assert not gate.try_acquire_nowait(third)  # 2 granted: the share
    assert _borrowed(gate) == 2
    trips = broker.round_trips
    await gate.release(second)  # no lease: nothing to remove in Redis
    assert broker.round_trips == trips and _borrowed(gate) == 1
    assert gate.try_acquire_nowait(third)


async def test_the_fallback_share_is_at_least_one_slot() -> None:
    redis = _Redis()
    broker = _broker(redis)
    gate = broker.gate("g", 4)
    redis.acquire = lambda keys, args: [0, 4, 4]  # 4 processes: a share of 1
    assert not await gate.try_acquire(object())
    redis.down = True
    assert await gate.try_acquire(object())
    assert not await gate.try_acquire(object())
    assert not gate.try_acquire_nowait(object())


async def test_without_the_fallback_nothing_is_granted_without_a_round_trip() -> None:
    broker = _broker(_Redis())
    gate = broker.gate("g", 4)
    assert not gate.try_acquire_nowait(object())
    assert _borrowed(gate) == 0


async def test_a_waiter_polls_with_a_doubling_delay_up_to_the_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    redis = _Redis()
    gate = _broker(redis).gate("g", 1)
    redis.acquire = lambda keys, args: [0, 1, 2]  # the cluster is full
    with trio.move_on_after(0.8):
        await gate.acquire(object())
    times = [t for _, t, _ in redis.named("acquire")]
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    assert gaps == [0.01, 0.02, 0.04, 0.08, 0.16, 0.2, 0.2]
    assert _borrowed(gate) == 0


async def test_an_acquired_slot_keeps_its_local_slot() -> None:
    gate = _broker(_Redis()).gate("g", 2)
    holder = object()
    await gate.acquire(holder)
    assert _borrowed(gate) == 1
    await gate.release(holder)
    assert _borrowed(gate) == 0


async def test_an_attempt_cancelled_mid_call_removes_its_lease_and_its_local_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    redis = _Redis()
    broker = _broker(redis)
    gate = broker.gate("g", 2)
    started = trio.Event()

    async def slow(source: str, keys: Sequence[str], args: Sequence[Value]) -> object:
        if source == ACQUIRE_SCRIPT:
            started.set()
            await trio.sleep_forever()
        return await _Redis.run_script(redis, source, keys, args)

    redis.run_script = slow  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.try_acquire, object())
        await started.wait()
        nursery.cancel_scope.cancel()
    # The lease Redis may have granted is removed, and the reply read as a good one.
    [(_, _, args)] = redis.named("release")
    assert str(args[0]).startswith("p:")
    assert broker.errors == 0 and not broker.fallback_active()
    assert _borrowed(gate) == 0


def test_a_reply_is_ints_then_strings() -> None:
    assert _parse([1, 0, b"p:1", 5], 2) == ([1, 0], ["p:1", "5"])
    for bad in ([1], [1, b"x"], "OK"):
        with pytest.raises(RedisError) as caught:
            _parse(bad, 2)
        assert str(caught.value) == f"unexpected lease script reply {bad!r}"


async def test_redis_failing_and_answering_again_are_each_said_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    redis = _Redis()
    broker = _broker(redis, on_error="refuse")
    gate = broker.gate("g", 2)
    redis.down = True
    with caplog.at_level(logging.WARNING, logger="trio_gateway"):
        assert not await gate.try_acquire(object())
        await broker._renew()
        redis.down = False
        assert await gate.try_acquire(object())
        await broker._renew()
        # A Redis that does not answer within timeout_s.

        async def hang(source: str, keys: Sequence[str], args: Sequence[Value]) -> object:
            await trio.sleep_forever()

        redis.run_script = hang  # type: ignore[method-assign]
        await broker._renew()
    assert [r.getMessage() for r in caplog.records] == [
        "admission leases: redis failing (redis connection failed: refused); on_error=refuse",
        "admission leases: redis answers again",
        "admission leases: redis failing (no answer within 1.0s); on_error=refuse",
    ]
    assert broker.errors == 3
