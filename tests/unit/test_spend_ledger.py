"""Keys' spend read back from the usage ledger (accounting/spend.py): the sums a restart
rebuilds budgets from, what `keys list` reads, and what the start-up line says."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from tests.unit.test_ledger_endpoint import old_ledger
from trio_gateway.accounting.admission import Limits, local_limits
from trio_gateway.accounting.ledger import connect, write_batch
from trio_gateway.accounting.limit_store import MemoryStore, RedisStore
from trio_gateway.accounting.spend import (
    LedgerSpend,
    ledger_spend,
    open_spend,
    seed_keys,
    spend_by_key_since,
    spend_since,
)
from trio_gateway.core.budget_period import period_of
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.usage import UsageRecord
from trio_gateway.redis.client import RedisClient

DAY = 86_400.0
NOW = 20 * DAY + 3600.0  # 01:00 on day 20


def record(key: str | None, at: float, cost: int) -> UsageRecord:
    return UsageRecord(
        request_id=f"{key}-{at}",
        key=key,
        alias="a",
        provider="p",
        outcome="completed",
        started_at=at,
        cost_nanos=cost,
    )


def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "usage.sqlite3"
    conn = connect(str(path))
    write_batch(
        conn,
        [
            record("alice", 5 * DAY, 1_000),  # an earlier day of the month... and of her life
            record("alice", 20 * DAY - 1, 20),  # the day before, its last second
            record("alice", 20 * DAY, 300),  # today's first instant
            record("alice", NOW, 4_000),
            record("bob", NOW, 7),
            record("carol", NOW, 0),  # a request that cost nothing
            record(None, NOW, 50_000),  # an open gateway's request: no key
        ],
    )
    conn.close()
    return path


def test_a_keys_spend_since_a_time_counts_that_instant_and_after(tmp_path: Path) -> None:
    conn = sqlite3.connect(ledger(tmp_path))
    assert spend_since(conn, "alice", 20 * DAY) == 4_300
    assert spend_since(conn, "alice", float("-inf")) == 5_320
    assert spend_since(conn, "bob", 20 * DAY) == 7
    assert spend_since(conn, "nobody", 0.0) == 0
    assert spend_by_key_since(conn, 20 * DAY) == {"alice": 4_300, "bob": 7}


def test_a_ledger_from_before_costs_has_no_spend(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    old_ledger(path)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert spend_since(conn, "alice", 0.0) == 0
    assert spend_by_key_since(conn, 0.0) == {}


KEYS = [
    ApiKey(name="alice", digest=b"", budget=1e-5, budget_period="day"),
    ApiKey(name="bob", digest=b"", budget=1.0),  # for its whole life
    ApiKey(name="dave", digest=b"", rpm=5),  # no budget: nothing to read
]


def test_keys_list_reads_each_budget_in_its_period(tmp_path: Path) -> None:
    reading = ledger_spend(str(ledger(tmp_path)), KEYS, now=NOW)
    assert reading.problem is None
    assert reading.source == f"the usage ledger {tmp_path / 'usage.sqlite3'}"
    alice, bob = reading.keys
    assert (alice.key.name, alice.period.id, alice.spent) == ("alice", "day:1970-01-21", 4_300)
    assert alice.remaining == 10_000 - 4_300
    assert (bob.key.name, bob.period.id, bob.spent) == ("bob", "none", 7)
    assert bob.remaining == 1_000_000_000 - 7
    overspent = attrs.evolve(alice, spent=20_000)
    assert overspent.remaining == 0
    assert attrs.evolve(alice, spent=None).remaining is None


def test_no_ledger_yet_is_nothing_spent_and_a_broken_one_is_a_problem(tmp_path: Path) -> None:
    missing = ledger_spend(str(tmp_path / "none.sqlite3"), KEYS, now=NOW)
    assert missing.problem is None and [k.spent for k in missing.keys] == [0, 0]
    broken = tmp_path / "broken.sqlite3"
    broken.write_bytes(b"not a database, " * 100)
    unreadable = ledger_spend(str(broken), KEYS, now=NOW)
    assert unreadable.problem is not None and "not a database" in unreadable.problem
    assert [k.spent for k in unreadable.keys] == [None, None]


async def test_at_start_each_budgeted_key_is_seeded_with_its_periods_spend(
    tmp_path: Path,
) -> None:
    limits = local_limits()
    spend = LedgerSpend(str(ledger(tmp_path)))
    rebuilt = await seed_keys(limits, spend, KEYS, now=NOW)
    assert (rebuilt.keys, rebuilt.spent) == (2, 4_307)
    assert rebuilt.seconds >= 0
    store = limits.store
    assert isinstance(store, MemoryStore)
    assert store.spent("alice") == 4_300
    assert store.period_of_spend("alice") == period_of("day", NOW).id
    assert store.spent("bob") == 7 and store.period_of_spend("bob") == "none"
    assert store.period_of_spend("dave") is None
    assert await spend.by_key_since(20 * DAY) == {"alice": 4_300, "bob": 7}
    assert await spend.since("alice", float("-inf")) == 5_320
    spend.close()
    spend.close()  # twice is fine


async def test_with_redis_nothing_is_read_from_the_ledger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(RedisClient.__new__(RedisClient))  # never called
    limits = Limits(store, timeout_s=1.0, fail_open=True, hold_ttl_s=60.0)
    spend = LedgerSpend(str(ledger(tmp_path)))
    assert await seed_keys(limits, spend, KEYS, now=NOW) == attrs.evolve(
        await seed_keys(local_limits(), spend, [], now=NOW)
    )
    with caplog.at_level(logging.INFO, logger="trio_gateway"):
        assert await open_spend(limits, str(tmp_path), KEYS, why_none="-", now=NOW) is None
    assert caplog.records == [] and limits.seeder is None
    spend.close()


async def test_the_start_up_line_says_where_spend_lives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = ledger(tmp_path)
    limits = local_limits()
    with caplog.at_level(logging.INFO, logger="trio_gateway"):
        spend = await open_spend(limits, str(path), KEYS, why_none="-", now=NOW)
    assert spend is not None and limits.seeder == spend.since
    spend.close()
    ((level, message),) = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert level == "INFO"
    assert message.startswith(
        "limits: budgets and rate limits in this process; spend of 2 keys with a budget rebuilt "
        f"from the usage ledger {path} in "
    )
    assert message.endswith(
        " s (0.000004307 spent in their current periods): a restart keeps it, other replicas "
        "do not share it ([redis] does)"
    )


async def test_without_a_ledger_a_budget_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="trio_gateway"):
        assert await open_spend(local_limits(), None, KEYS, why_none="ledger none", now=NOW) is None
        assert await open_spend(local_limits(), None, KEYS[2:], why_none="x", now=NOW) is None
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "WARNING",
            "limits: budgets and rate limits in this process only, with no ledger to rebuild "
            "spend from (ledger none): a restart resets every budget (2 keys with a budget)",
        ),
        (
            "INFO",
            "limits: budgets and rate limits in this process only, with no ledger to rebuild "
            "spend from (x): a restart resets every budget (0 keys with a budget)",
        ),
    ]


async def test_a_ledger_that_cannot_be_read_at_start_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "broken.sqlite3"
    broken.write_bytes(b"not a database, " * 100)
    limits = local_limits()
    with caplog.at_level(logging.INFO, logger="trio_gateway"):
        assert await open_spend(limits, str(broken), KEYS, why_none="-", now=NOW) is None
    assert limits.seeder is None
    ((level, message),) = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert level == "ERROR"
    assert message.startswith(f"limits: spend could not be read from the usage ledger {broken}: ")


MESSAGES = [{"role": "user", "content": "hi"}]


async def test_a_seed_that_fails_counts_from_0_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(key: str, since: float) -> int:
        await trio.lowlevel.checkpoint()
        raise sqlite3.OperationalError("disk I/O error")

    limits = local_limits()
    limits.seeder = broken
    with caplog.at_level(logging.ERROR, logger="trio_gateway"):
        admission = await limits.admit(KEYS[0], {"messages": MESSAGES}, ())
    assert admission is not None
    store = limits.store
    assert isinstance(store, MemoryStore) and store.knows("alice", period_of("day", NOW))
    assert [r.getMessage() for r in caplog.records] == [
        "limits: the spend of key alice could not be read from the usage ledger (disk I/O "
        "error); its budget counts from 0 in this process"
    ]


async def test_a_seed_that_hangs_is_bounded(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def stuck(key: str, since: float) -> int:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    limits = local_limits()
    limits.seeder = stuck
    with caplog.at_level(logging.ERROR, logger="trio_gateway"):
        assert await limits.admit(KEYS[1], {"messages": MESSAGES}, ()) is not None
    assert "could not be read from the usage ledger (no answer within 10 s)" in (
        caplog.records[0].getMessage()
    )
