"""How the Redis store reads its Lua script's answer (status, remaining, reset, retry, what is
left) into decisions, with the script's replies given by hand (mutation testing,
docs/testing.md). The scripts themselves run against a real Redis in tests/e2e/test_limits.py
and tests/e2e/test_mut_money_redis.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import attrs
import pytest
import trio

from trio_gateway.accounting.limit_store import AdmitArgs, RedisStore
from trio_gateway.accounting.limits import RateDecision
from trio_gateway.core.budget_period import period_of
from trio_gateway.redis.client import RedisClient, RedisError, Value


class _Scripted:
    """A Redis client whose scripts answer ``reply`` and record what they were given."""

    def __init__(self, reply: object) -> None:
        self.reply = reply
        self.calls: list[tuple[list[str], list[Value]]] = []

    async def run_script(self, source: str, keys: Sequence[str], args: Sequence[Value]) -> object:
        await trio.lowlevel.checkpoint()
        self.calls.append((list(keys), list(args)))
        return self.reply


def _store(reply: object, prefix: str | None = None) -> tuple[RedisStore, _Scripted]:
    client = _Scripted(reply)
    redis = cast(RedisClient, client)
    return (RedisStore(redis) if prefix is None else RedisStore(redis, prefix)), client


ARGS = AdmitArgs(key="k", rpm=10, tpm=100, tokens=5, budget=None, hold=0, hold_id="", ttl_s=2.5)


async def test_the_keys_are_under_tgw_by_default_with_the_key_as_hash_tag() -> None:
    store, client = _store([0, 9, 6000, 95, 3000, 0, b"0"])
    await store.admit(ARGS)
    keys, args = client.calls[0]
    assert keys == [
        "tgw:rl:req:{k}",
        "tgw:rl:tok:{k}",
        "tgw:spent:{k}",
        "tgw:holds:{k}",
        "tgw:holdexp:{k}",
    ]
    # No budget: -1; the hold's TTL in ms.
    assert args == [10, 100, 5, -1, 0, "", 2500]


async def test_an_allowed_answer_becomes_two_decisions() -> None:
    store, _ = _store([0, 9, 6000, 95, 3000, 0, b"1234"])
    result = await store.admit(ARGS)
    assert result.refused is None and result.available == 1234 and result.retry_after_s == 0.0
    assert result.requests == RateDecision(
        allowed=True, limit=10, remaining=9, reset_s=6.0, retry_after_s=0.0, tat=0.0
    )
    assert result.tokens == RateDecision(
        allowed=True, limit=100, remaining=95, reset_s=3.0, retry_after_s=0.0, tat=0.0
    )


async def test_a_rate_refusal_says_how_long_to_wait() -> None:
    store, _ = _store([1, 0, 60000, 95, 3000, 1500, b"0"])
    result = await store.admit(ARGS)
    assert result.refused == "rate" and result.retry_after_s == 1.5
    assert result.requests is not None and not result.requests.allowed
    assert result.tokens is not None and not result.tokens.allowed


async def test_a_budget_refusal_is_no_rate_refusal() -> None:
    store, _ = _store([2, 9, 6000, 95, 3000, 0, b"77"])
    result = await store.admit(ARGS)
    assert result.refused == "budget" and result.available == 77
    assert result.requests is not None and result.requests.allowed


async def test_a_key_without_limits_gets_no_decisions() -> None:
    store, _ = _store([0, 0, 0, 0, 0, 0, b"5"])
    result = await store.admit(
        AdmitArgs(key="k", rpm=None, tpm=None, tokens=5, budget=9, hold=1, hold_id="h", ttl_s=0)
    )
    assert result.requests is None and result.tokens is None


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ([0, 1], "unexpected admit reply [0, 1]"),
        ("OK", "unexpected admit reply 'OK'"),
        ([0, 9, 6000, 95, 3000, 0, None], "unexpected reply None"),
    ],
)
async def test_a_reply_of_another_shape_is_a_redis_error(reply: object, message: str) -> None:
    store, _ = _store(reply)
    with pytest.raises(RedisError) as caught:
        await store.admit(ARGS)
    assert str(caught.value) == message


async def test_settle_names_the_keys_under_the_prefix() -> None:
    store, client = _store(5, prefix="p:")
    await store.settle("k", "h1", 42)
    assert client.calls == [(["p:spent:{k}", "p:holds:{k}", "p:holdexp:{k}"], ["h1", 42, 0])]


async def test_a_periods_spend_has_its_own_key_kept_a_week_past_the_period() -> None:
    store, client = _store(5, prefix="p:")
    day = period_of("day", 1_796_256_000.0)  # 2026-12-03T00:00:00Z
    await store.settle("k", "h1", 42, day)
    end_ms = 1_796_342_400_000
    assert client.calls == [
        (
            ["p:spent:{k}:day:2026-12-03", "p:holds:{k}", "p:holdexp:{k}"],
            ["h1", 42, end_ms + 7 * 86_400_000],
        )
    ]
    admitting, client = _store([0, 0, 0, 0, 0, 0, b"0"], prefix="p:")
    await admitting.admit(attrs.evolve(ARGS, period=day))
    assert client.calls[0][0][2] == "p:spent:{k}:day:2026-12-03"
    assert admitting.spent_key("k") == "p:spent:{k}"


async def test_a_hold_of_less_than_a_millisecond_lives_one() -> None:
    store, client = _store([0, 0, 0, 0, 0, 0, b"0"])
    await store.admit(
        AdmitArgs(key="k", rpm=None, tpm=None, tokens=1, budget=9, hold=1, hold_id="h", ttl_s=1e-4)
    )
    assert client.calls[0][1][-1] == 1
