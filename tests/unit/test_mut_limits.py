"""Budgets and rate limits to the nano and the second: the GCRA's answers, the in-process
store's, and what admission and settlement do with them (mutation testing, docs/testing.md)."""

from __future__ import annotations

import logging

import attrs
import pytest
import trio
import trio.testing

from tests.unit.test_limits import BODY, KEY, _args, _DownStore
from trio_gateway.accounting import limit_store
from trio_gateway.accounting.admission import (
    Admission,
    Limits,
    _untaken,
    local_limits,
    prices_of,
)
from trio_gateway.accounting.limit_store import AdmitArgs, MemoryStore
from trio_gateway.accounting.limits import Prices, RateDecision, covers, gcra
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.budget_period import LIFETIME, Period
from trio_gateway.core.errors import LimitsUnavailable
from trio_gateway.core.usage import UsageRecord


def test_a_budget_covers_exactly_what_is_left() -> None:
    assert covers(100, 30, 20, 50)
    assert not covers(100, 30, 20, 51)


def test_gcra_allowed_says_when_the_limit_is_whole_again() -> None:
    decision = gcra(0.0, 1000.0, 60, 3)
    assert decision == RateDecision(
        allowed=True, limit=60, remaining=57, reset_s=3.0, retry_after_s=0.0, tat=1003.0
    )


def test_gcra_refused_says_the_reset_and_the_wait() -> None:
    # 60/min, tat 55 s ahead: 5 units left, a cost of 8 waits 3 s.
    decision = gcra(1055.0, 1000.0, 60, 8)
    assert decision == RateDecision(
        allowed=False, limit=60, remaining=5, reset_s=55.0, retry_after_s=3.0, tat=1055.0
    )


def test_gcra_refused_within_a_second_of_the_reset() -> None:
    # The whole limit asked for, half a second before it is whole again.
    decision = gcra(1000.5, 1000.0, 60, 60)
    assert not decision.allowed
    assert decision.reset_s == 0.5 and decision.retry_after_s == 0.5


def test_gcra_a_cost_of_nothing_takes_nothing() -> None:
    decision = gcra(0.0, 1000.0, 60, 0)
    assert decision.allowed and decision.tat == 1000.0 and decision.remaining == 60
    assert decision.reset_s == 0.0
    assert gcra(0.0, 1000.0, 60, -5).tat == 1000.0


def test_untaken_gives_back_the_units_and_the_time() -> None:
    decision = RateDecision(
        allowed=True, limit=60, remaining=10, reset_s=30.0, retry_after_s=0.0, tat=5.0
    )
    assert _untaken(decision, 5) == attrs.evolve(decision, remaining=15, reset_s=25.0)
    # Never more than the limit back, never a negative reset.
    assert _untaken(decision, 100) == attrs.evolve(decision, remaining=60, reset_s=0.0)
    assert _untaken(None, 5) is None


def test_prices_come_from_the_provider() -> None:
    provider = ProviderConfig(
        name="p",
        type="openai",
        model="gpt-4o",
        price_input_per_mtok=1.5,
        price_cached_input_per_mtok=0.5,
        price_output_per_mtok=6.0,
    )
    assert prices_of(provider) == Prices(input=1.5, cached_input=0.5, output=6.0)


async def test_memory_store_a_rate_refusal_reports_both_limits() -> None:
    store = MemoryStore()
    args = AdmitArgs(key="k", rpm=1, tpm=100, tokens=10, budget=None, hold=0, hold_id="", ttl_s=9)
    first = await store.admit(args)
    assert first.refused is None and first.available == 0
    refused = await store.admit(args)
    assert refused.refused == "rate"
    assert refused.requests is not None and refused.requests.remaining == 0
    assert refused.tokens is not None and refused.tokens.remaining == 80
    assert refused.tokens.limit == 100


async def test_memory_store_a_budget_refusal_reports_the_limits_and_what_is_left() -> None:
    store = MemoryStore()
    args = AdmitArgs(
        key="k", rpm=10, tpm=100, tokens=10, budget=1000, hold=300, hold_id="a", ttl_s=9
    )
    admitted = await store.admit(args)
    assert admitted.refused is None and admitted.available == 700
    await store.settle("k", "a", 200)
    second = await store.admit(attrs.evolve(args, hold_id="b"))
    assert second.available == 1000 - 200 - 300
    third = await store.admit(attrs.evolve(args, hold_id="c", hold=100))
    assert third.available == 1000 - 200 - 300 - 100  # b's hold still counts
    refused = await store.admit(attrs.evolve(args, hold_id="d", hold=500))
    assert refused.refused == "budget" and refused.available == 400
    # Each decision as if this request had been taken (the caller gives it back: _untaken).
    assert refused.requests is not None and refused.requests.remaining == 6
    assert refused.tokens is not None and refused.tokens.remaining == 60


async def test_memory_store_a_budget_spent_past_its_end_has_nothing_left() -> None:
    store = MemoryStore()
    await store.settle("k", "none", 1500)
    refused = await store.admit(_args("k", 1, "a", 1000))
    assert refused.refused == "budget" and refused.available == 0


async def test_memory_store_without_a_budget_reports_nothing_available() -> None:
    store = MemoryStore()
    args = AdmitArgs(key="k", rpm=5, tpm=None, tokens=1, budget=None, hold=50, hold_id="", ttl_s=9)
    assert (await store.admit(args)).available == 0
    assert store.held("k") == 0


async def test_memory_store_holds_per_key_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limit_store, "MAX_LOCAL_HOLDS_PER_KEY", 2)
    store = MemoryStore()
    assert (await store.admit(_args("k", 1, "a", 1000))).refused is None
    assert (await store.admit(_args("k", 1, "b", 1000))).refused is None
    third = await store.admit(_args("k", 1, "c", 1000))
    assert third.refused == "budget" and third.available == 998


async def test_memory_store_settling_an_unknown_hold_still_bills() -> None:
    store = MemoryStore()
    await store.settle("k", "gone", 7)
    await store.settle("k", "gone", 3)
    assert store.spent("k") == 10 and store.spent("other") == 0


async def test_a_settle_in_a_cancelled_task_still_bills() -> None:
    limits = local_limits()
    store = limits.store
    assert isinstance(store, MemoryStore)
    prices = {"p": Prices(input=1000.0)}  # one token: 1,000,000 nanos
    admission = Admission(key="alice", hold_id="h", headers=[], prices=prices)
    record = UsageRecord(
        request_id="r",
        key="alice",
        alias="a",
        provider="p",
        outcome="cancelled",
        prompt_tokens=2,
        started_at=0.0,
    )
    with trio.CancelScope() as scope:
        scope.cancel()
        await limits.settle(admission, record)
    assert store.spent("alice") == 2_000_000


class _SlowStore(MemoryStore):
    async def settle(self, key: str, hold_id: str, cost: int, period: Period = LIFETIME) -> None:
        await trio.sleep_forever()


async def test_a_late_settle_is_logged_and_counted(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    limits = Limits(_SlowStore(), timeout_s=0.5, fail_open=True, hold_ttl_s=60)
    prices = {"p": Prices(output=1000.0)}
    admission = Admission(key="alice", hold_id="h", headers=[], prices=prices)
    record = UsageRecord(
        request_id="r",
        key="alice",
        alias="a",
        provider="p",
        outcome="completed",
        completion_tokens=3,
        started_at=0.0,
    )
    with caplog.at_level(logging.WARNING, logger="trio_gateway"):
        await limits.settle(admission, record)
    assert [r.getMessage() for r in caplog.records] == [
        "limits: settling 3000000 nanos for key alice timed out; its hold expires"
    ]
    assert limits.store_errors == {"settle": 1}


async def test_a_failed_settle_is_logged_with_its_cost(caplog: pytest.LogCaptureFixture) -> None:
    limits = Limits(_DownStore(), timeout_s=0.5, fail_open=True, hold_ttl_s=60)
    admission = Admission(key="alice", hold_id="h", headers=[], prices={"p": Prices(input=1e3)})
    record = UsageRecord(
        request_id="r",
        key="alice",
        alias="a",
        provider="p",
        outcome="completed",
        prompt_tokens=1,
        started_at=0.0,
    )
    with caplog.at_level(logging.WARNING, logger="trio_gateway"):
        await limits.settle(admission, record)
    assert [r.getMessage() for r in caplog.records] == [
        "limits: could not settle 1000000 nanos for key alice (redis connection failed: refused)"
    ]
    assert limits.store_errors == {"settle": 1}


async def test_fail_closed_says_so_to_the_client_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = Limits(_DownStore(), timeout_s=0.5, fail_open=False, hold_ttl_s=60)
    with (
        caplog.at_level(logging.WARNING, logger="trio_gateway"),
        pytest.raises(LimitsUnavailable) as refused,
    ):
        await limits.admit(KEY, BODY, ())
    assert refused.value.message == (
        "budgets and rate limits cannot be checked right now; retry shortly"
    )
    assert [r.getMessage() for r in caplog.records] == [
        "limits: store unavailable (redis connection failed: refused); refusing (fail_closed)"
    ]


async def test_a_record_without_a_provider_is_billed_nothing() -> None:
    limits = local_limits()
    store = limits.store
    assert isinstance(store, MemoryStore)
    # Whatever the providers are called (a name is never empty): none answered, no price applies.
    prices = {name: Prices(input=1000.0) for name in ("XXXX", "None", "null")}
    admission = Admission(key="alice", hold_id="h", headers=[], prices=prices)
    record = UsageRecord(
        request_id="r",
        key="alice",
        alias="a",
        provider=None,
        outcome="failed",
        prompt_tokens=5,
        started_at=0.0,
    )
    await limits.settle(admission, record)
    assert store.spent("alice") == 0
