"""The arithmetic of budgets and rate limits (limits.py), and the in-process store."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from trio_gateway.accounting.admission import STORE_ERROR_LOG_INTERVAL_S, Admission, Limits
from trio_gateway.accounting.limit_store import AdmitArgs, AdmitResult, MemoryStore
from trio_gateway.accounting.limits import (
    Prices,
    cost_nanos,
    gcra,
    nanos,
    rate_headers,
    reserve_tokens,
    reset_text,
)
from trio_gateway.core.budget_period import LIFETIME, Period
from trio_gateway.core.errors import LimitsUnavailable
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.usage import UsageRecord
from trio_gateway.redis.client import RedisError


@pytest.mark.parametrize(
    ("prices", "prompt", "cached", "completion", "expected"),
    [
        (Prices(), 1000, 0, 1000, 0),
        (Prices(input=1.0), 1_000_000, 0, 0, 1_000_000_000),
        (
            Prices(input=2.0, cached_input=0.5, output=8.0),
            1000,
            400,
            100,
            1_200_000 + 200_000 + 800_000,
        ),
        (Prices(input=0.15), 1, 0, 0, 150),
        (Prices(output=0.0001), 0, 0, 1, 1),  # 0.1 nano rounds up
        (Prices(input=1.0), 10, 50, 0, 0),  # cached never exceeds prompt
    ],
)
def test_cost(prices: Prices, prompt: int, cached: int, completion: int, expected: int) -> None:
    assert cost_nanos(prices, prompt, cached, completion) == expected


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "default", "expected"),
    [(10, 100, 4096, 110), (10, None, 4096, 4106), (0, 0, 50, 50), (-3, 5, 1, 5)],
)
def test_reserve_tokens(prompt: int, max_tokens: int | None, default: int, expected: int) -> None:
    assert reserve_tokens(prompt, max_tokens, default) == expected


def test_gcra_allows_a_burst_of_the_limit_then_one_per_interval() -> None:
    tat, now = 0.0, 1000.0
    for i in range(6):
        d = gcra(tat, now, 6, 1)
        assert d.allowed and d.remaining == 5 - i
        tat = d.tat
    refused = gcra(tat, now, 6, 1)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(10.0)
    assert refused.tat == tat
    assert gcra(tat, now + 10.0, 6, 1).allowed


def test_gcra_a_cost_above_the_limit_waits_for_the_whole_limit() -> None:
    d = gcra(0.0, 100.0, 10, 1000)
    assert d.allowed and d.remaining == 0
    assert not gcra(d.tat, 100.0, 10, 1).allowed


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.02, "20ms"), (0.0, "0ms"), (1.0, "1s"), (59.2, "1m0s"), (360, "6m0s")]
)
def test_reset_text(seconds: float, text: str) -> None:
    assert reset_text(seconds) == text


def test_rate_headers_name_both_limits() -> None:
    names = [n for n, _ in rate_headers(gcra(0, 0, 5, 1), gcra(0, 0, 100, 10))]
    assert names == [
        b"x-ratelimit-limit-requests",
        b"x-ratelimit-remaining-requests",
        b"x-ratelimit-reset-requests",
        b"x-ratelimit-limit-tokens",
        b"x-ratelimit-remaining-tokens",
        b"x-ratelimit-reset-tokens",
    ]


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 10), st.floats(0, 3)), max_size=60))
def test_gcra_never_allows_more_than_the_limit_per_window(
    steps: list[tuple[int, int, float]],
) -> None:
    limit, tat, now, allowed = 20, 0.0, 0.0, []
    for _, cost, dt in steps:
        now += dt
        d = gcra(tat, now, limit, cost)
        if d.allowed:
            tat = d.tat
            allowed.append((now, min(cost, limit)))
    for t0, _ in allowed:
        # Within any minute, at most one burst of `limit` plus what drained meanwhile.
        assert sum(c for t, c in allowed if t0 <= t < t0 + 60) <= 2 * limit


def _args(
    key: str, hold: int, hold_id: str, budget: int | None = 1000, ttl_s: float = 10.0
) -> AdmitArgs:
    return AdmitArgs(
        key=key,
        rpm=None,
        tpm=None,
        tokens=1,
        budget=budget,
        hold=hold,
        hold_id=hold_id,
        ttl_s=ttl_s,
    )


@settings(deadline=None, max_examples=50)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 400), st.integers(0, 400)), max_size=40))
def test_memory_store_never_overspends(steps: list[tuple[bool, int, int]]) -> None:
    """For any sequence of reserves and settles (each settle at most its hold), spent plus live
    holds never exceed the budget."""

    async def run() -> None:
        store, budget = MemoryStore(), 1000
        live: list[tuple[str, int]] = []
        for i, (settle, hold, cost) in enumerate(steps):
            if settle and live:
                hold_id, held = live.pop(0)
                await store.settle("k", hold_id, min(cost, held))
            else:
                result = await store.admit(_args("k", hold, str(i), budget))
                if result.refused is None:
                    live.append((str(i), hold))
            assert store.spent("k") + store.held("k") <= budget

    trio.run(run)


async def test_memory_store_holds_expire(autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryStore()
    assert (await store.admit(_args("k", 800, "a", ttl_s=5.0))).refused is None
    refused = await store.admit(_args("k", 800, "b"))
    assert refused.refused == "budget" and refused.available == 200
    await trio.sleep(5.0)
    assert store.held("k") == 0
    assert (await store.admit(_args("k", 800, "b"))).refused is None


async def test_memory_store_rate_refusal_takes_nothing() -> None:
    store = MemoryStore()
    args = AdmitArgs(key="k", rpm=1, tpm=None, tokens=1, budget=1000, hold=10, hold_id="a", ttl_s=9)
    assert (await store.admit(args)).refused is None
    again = await store.admit(attrs.evolve(args, hold_id="b"))
    assert again.refused == "rate" and again.retry_after_s > 59
    assert store.held("k") == 10


def test_nanos_rounds_down() -> None:
    assert nanos(0.1) == 100_000_000
    assert nanos(1e-10) == 0


class _DownStore:
    """A store whose every call fails as a Redis that is down does."""

    async def admit(self, args: AdmitArgs) -> AdmitResult:
        await trio.lowlevel.checkpoint()
        raise RedisError("redis connection failed: refused")

    async def settle(self, key: str, hold_id: str, cost: int, period: Period = LIFETIME) -> None:
        await trio.lowlevel.checkpoint()
        raise RedisError("redis connection failed: refused")

    async def spent_in(self, key: str, period: Period) -> int:
        await trio.lowlevel.checkpoint()
        raise RedisError("redis connection failed: refused")


def _limits(*, fail_open: bool) -> Limits:
    return Limits(_DownStore(), timeout_s=0.25, fail_open=fail_open, hold_ttl_s=60)


KEY = ApiKey(name="alice", digest=b"", rpm=10)
BODY: dict[str, object] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def _error_counts(limits: Limits) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(limits.collector())
    return {
        call: registry.get_sample_value("gateway_limits_store_errors_total", {"call": call}) or 0
        for call in ("admit", "settle")
    }


async def test_fail_open_serves_unlimited_and_logs_once_per_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    limits = _limits(fail_open=True)
    for _ in range(5):
        admission = await limits.admit(KEY, BODY, ())
        # Admitted without headers or a hold: nothing could be checked.
        assert admission is not None and admission.headers == [] and admission.hold_id is None
    lines = [r.getMessage() for r in caplog.records if r.name == "trio_gateway"]
    assert lines == [
        "limits: store unavailable (redis connection failed: refused); "
        "serving unlimited (fail_open)"
    ]
    await trio.sleep(STORE_ERROR_LOG_INTERVAL_S)
    await limits.admit(KEY, BODY, ())
    lines = [r.getMessage() for r in caplog.records if r.name == "trio_gateway"]
    assert len(lines) == 2 and lines[1].endswith("(4 more since the last line)")
    assert _error_counts(limits) == {"admit": 6, "settle": 0}


async def test_fail_closed_refuses_with_503_and_counts() -> None:
    limits = _limits(fail_open=False)
    with pytest.raises(LimitsUnavailable) as refused:
        await limits.admit(KEY, BODY, ())
    assert refused.value.status == 503 and refused.value.retry_after_s == 1.0
    assert _error_counts(limits) == {"admit": 1, "settle": 0}


async def test_a_failed_settle_is_counted_not_raised() -> None:
    limits = _limits(fail_open=True)
    admission = Admission(key="alice", hold_id="h", headers=[])
    record = UsageRecord(
        request_id="r", key="alice", alias="a", provider="p", outcome="completed", started_at=0.0
    )
    await limits.settle(admission, record)
    assert _error_counts(limits) == {"admit": 0, "settle": 1}
