"""Budgets per period (UTC day, week, month, or the key's life): the in-process store renews a
key's spend when its period ends, a 402 says when, and every answer says what is left.

The period a request counts in is the one its record started in (``started_at``), so the store
and a ledger rebuild (accounting/spend.py) agree."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import trio

from trio_gateway.accounting.admission import Admission, Limits, Reserve
from trio_gateway.accounting.limit_store import AdmitArgs, MemoryStore
from trio_gateway.accounting.limits import (
    budget_headers,
    exact_units,
    format_units,
    reset_text,
)
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.budget_period import LIFETIME, period_of
from trio_gateway.core.errors import BudgetExceeded
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.usage import UsageRecord

MESSAGES = [{"role": "user", "content": "hi"}]
# One output token costs 1e-3 (1,000,000 nanos); the prompt is free.
PRICEY = ProviderConfig(name="p", type="openai", model="gpt-4o", price_output_per_mtok=1000.0)
DAILY = ApiKey(name="alice", digest=b"", budget=0.01, budget_period="day")


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def day(text: str) -> str:
    return period_of("day", ts(text)).id


def args(period: str, hold: int, hold_id: str, budget: int = 1000) -> AdmitArgs:
    return AdmitArgs(
        key="k",
        rpm=None,
        tpm=None,
        tokens=1,
        budget=budget,
        hold=hold,
        hold_id=hold_id,
        ttl_s=60.0,
        period=period_of("day", ts(period)),
    )


async def test_the_memory_store_renews_spend_when_the_period_changes() -> None:
    store = MemoryStore()
    assert (await store.admit(args("2026-12-03T10:00", 600, "a"))).refused is None
    await store.settle("k", "a", 600, period_of("day", ts("2026-12-03T10:00")))
    assert store.spent("k") == 600
    refused = await store.admit(args("2026-12-03T23:59", 500, "b"))
    assert refused.refused == "budget" and refused.available == 400
    # The next UTC day: the whole budget again.
    renewed = await store.admit(args("2026-12-04T00:00", 500, "c"))
    assert renewed.refused is None and renewed.available == 500
    assert store.spent("k") == 0


async def test_a_late_settle_counts_in_the_period_its_request_started_in() -> None:
    store = MemoryStore()
    await store.admit(args("2026-12-03T23:59", 300, "late"))
    await store.admit(args("2026-12-03T23:59", 300, "early"))
    # Started on the 4th: the store moves to the 4th with it.
    await store.settle("k", "early", 200, period_of("day", ts("2026-12-04T00:00:01")))
    assert store.spent("k") == 200 and store.period_of_spend("k") == day("2026-12-04T00:00")
    # Started on the 3rd, settled after: the 3rd is over, nothing of it counts on the 4th.
    await store.settle("k", "late", 300, period_of("day", ts("2026-12-03T23:59")))
    assert store.spent("k") == 200 and store.held("k") == 0


async def test_a_store_knows_a_keys_spend_once_it_has_a_period_of_that_kind() -> None:
    store = MemoryStore()
    today = period_of("day", ts("2026-12-03T10:00"))
    assert not store.knows("k", today)
    # A key with only rate limits has state, and no spend known.
    await store.admit(
        AdmitArgs(key="k", rpm=5, tpm=None, tokens=1, budget=None, hold=0, hold_id="", ttl_s=1.0)
    )
    assert not store.knows("k", today)
    store.seed("k", today, 700)
    assert store.knows("k", today) and store.spent("k") == 700
    store.seed("k", today, 5)  # a second seed (a concurrent one) changes nothing
    assert store.spent("k") == 700
    # Another day of the same kind is known (a renewal); another kind is not.
    assert store.knows("k", period_of("day", ts("2026-12-09T10:00")))
    assert not store.knows("k", period_of("month", ts("2026-12-03T10:00")))
    assert not store.knows("k", LIFETIME)


def test_amounts_are_shown_in_the_prices_unit() -> None:
    assert format_units(0) == "0.000000"
    assert format_units(1) == "0.000001"  # a cost is rounded up: never shown as nothing
    assert format_units(1_500_000_000) == "1.500000"
    assert exact_units(4_998_765_625) == "4.998765625"
    assert exact_units(5_000_000_000) == "5"
    assert exact_units(100) == "0.0000001"
    assert exact_units(0) == "0"


@pytest.mark.parametrize(
    ("seconds", "text"), [(3600, "1h0m0s"), (86399.5, "24h0m0s"), (90061, "25h1m1s")]
)
def test_reset_text_past_an_hour_is_spelled_as_go_durations_are(seconds: float, text: str) -> None:
    assert reset_text(seconds) == text


def test_budget_headers() -> None:
    assert budget_headers(5_000_000_000, 4_250_000_000, 3600.0) == [
        (b"x-ratelimit-limit-budget", b"5"),
        (b"x-ratelimit-remaining-budget", b"4.25"),
        (b"x-ratelimit-reset-budget", b"1h0m0s"),
    ]
    # A budget for the key's whole life never resets; what is left is never below 0.
    assert budget_headers(5, -3, None) == [
        (b"x-ratelimit-limit-budget", b"0.000000005"),
        (b"x-ratelimit-remaining-budget", b"0"),
    ]


def limits_at(clock: list[float]) -> Limits:
    return Limits(
        MemoryStore(), timeout_s=1.0, fail_open=False, hold_ttl_s=60.0, wall_clock=lambda: clock[0]
    )


def answered(started_at: float, completion_tokens: int) -> UsageRecord:
    return UsageRecord(
        request_id="r",
        key="alice",
        alias="a",
        provider="p",
        outcome="completed",
        completion_tokens=completion_tokens,
        started_at=started_at,
    )


async def test_a_daily_budget_refuses_until_midnight_utc_and_says_so() -> None:
    clock = [ts("2026-12-03T22:00:00")]
    limits = limits_at(clock)
    body: dict[str, object] = {"messages": MESSAGES, "max_tokens": 8}
    admission = await limits.admit(DAILY, body, (Reserve(PRICEY, 8),))
    assert admission is not None and admission.budget_period == "day"
    headers = dict(admission.headers)
    assert headers[b"x-ratelimit-limit-budget"] == b"0.01"
    assert headers[b"x-ratelimit-remaining-budget"] == b"0.002"  # 0.01 - the hold of 8 tokens
    assert headers[b"x-ratelimit-reset-budget"] == b"2h0m0s"
    await limits.settle(admission, answered(clock[0], 8))
    with pytest.raises(BudgetExceeded) as refused:
        await limits.admit(DAILY, {"messages": MESSAGES, "max_tokens": 3}, (Reserve(PRICEY, 3),))
    message = refused.value.message
    assert message.startswith("API key 'alice' has 0.002000 of its budget left")
    assert message.endswith(
        "; its budget (0.01 a day, UTC) renews at 2026-12-04T00:00:00Z, in 2h0m0s"
    )
    refused_headers = dict(refused.value.rate_headers)
    assert refused_headers[b"x-ratelimit-remaining-budget"] == b"0.002"
    assert refused_headers[b"x-ratelimit-reset-budget"] == b"2h0m0s"
    clock[0] = ts("2026-12-04T00:00:00")
    renewed = await limits.admit(
        DAILY, {"messages": MESSAGES, "max_tokens": 3}, (Reserve(PRICEY, 3),)
    )
    assert renewed is not None
    assert dict(renewed.headers)[b"x-ratelimit-remaining-budget"] == b"0.007"


async def test_a_lifetime_budget_says_it_does_not_renew() -> None:
    limits = limits_at([ts("2026-12-03T22:00:00")])
    key = ApiKey(name="bob", digest=b"", budget=0.001)
    with pytest.raises(BudgetExceeded) as refused:
        await limits.admit(key, {"messages": MESSAGES, "max_tokens": 3}, (Reserve(PRICEY, 3),))
    assert refused.value.message.endswith(
        "; its budget (0.001 for the key's whole life: budget_period none) does not renew"
    )
    assert b"x-ratelimit-reset-budget" not in dict(refused.value.rate_headers)


async def test_an_unknown_keys_spend_is_seeded_once_from_the_ledger() -> None:
    clock = [ts("2026-12-03T10:00:00")]
    limits = limits_at(clock)
    asked: list[tuple[str, float]] = []

    async def seed(key: str, since: float) -> int:
        asked.append((key, since))
        await trio.lowlevel.checkpoint()
        return 9_000_000  # 0.009 of 0.01 spent today, before this process started

    limits.seeder = seed
    body: dict[str, object] = {"messages": MESSAGES, "max_tokens": 1}
    admission = await limits.admit(DAILY, body, (Reserve(PRICEY, 1),))
    assert admission is not None
    assert dict(admission.headers)[b"x-ratelimit-remaining-budget"] == b"0"
    assert asked == [("alice", ts("2026-12-03T00:00:00"))]
    with pytest.raises(BudgetExceeded):
        await limits.admit(DAILY, body, (Reserve(PRICEY, 1),))
    assert len(asked) == 1  # known now: not read again
    # The next day is a renewal of a known kind: nothing to read.
    clock[0] = ts("2026-12-04T10:00:00")
    assert await limits.admit(DAILY, body, (Reserve(PRICEY, 1),)) is not None
    assert len(asked) == 1


async def test_settling_counts_in_the_period_the_record_started_in() -> None:
    clock = [ts("2026-12-03T23:59:59")]
    limits = limits_at(clock)
    store = limits.store
    assert isinstance(store, MemoryStore)
    admission = await limits.admit(
        DAILY, {"messages": MESSAGES, "max_tokens": 2}, (Reserve(PRICEY, 2),)
    )
    assert isinstance(admission, Admission)
    await limits.settle(admission, answered(ts("2026-12-04T00:00:00.5"), 2))
    assert store.period_of_spend("alice") == day("2026-12-04T00:00")
    assert store.spent("alice") == 2_000_000


async def test_a_key_without_a_budget_gets_no_budget_headers() -> None:
    limits = limits_at([ts("2026-12-03T22:00:00")])
    key = ApiKey(name="carol", digest=b"", rpm=5)
    admission = await limits.admit(
        key, {"messages": MESSAGES, "max_tokens": 3}, (Reserve(PRICEY, 3),)
    )
    assert admission is not None and admission.hold_id is None
    assert [name for name, _ in admission.headers] == [
        b"x-ratelimit-limit-requests",
        b"x-ratelimit-remaining-requests",
        b"x-ratelimit-reset-requests",
    ]
