"""Keys' spend read back from the usage ledger: how budgets kept in this process survive a
restart, and what ``keys list``, the status page and ``usage --reconcile`` show.

Every settled request is a row of the ledger with its cost (``cost_nanos``, the amount its
budget was billed) and its ``started_at``, which decides its budget period (core/budget_period.py)
exactly as the stores do. A key's spend in a period is one indexed query (``usage_key_spend``:
key, started_at, cost_nanos; read from the index alone), so a ledger of millions of rows is read
in milliseconds per key (docs/accounting.md has the measure).

::

    start ─▶ seed_keys: each key with a budget ─▶ spend_since(key, its period's start)
               ─▶ MemoryStore.seed (admission.Limits: a key seen later is seeded at its
                  first request)
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.request import pathname2url

import attrs
import trio

from trio_gateway.accounting.admission import Limits
from trio_gateway.accounting.limit_store import MemoryStore, RedisStore
from trio_gateway.accounting.limits import exact_units, nanos
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.core.budget_period import Period, period_of
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.words import counted
from trio_gateway.redis.client import RedisError, open_redis
from trio_gateway.redis.url import parse_redis_url

log = logging.getLogger("trio_gateway")

# A shell's read of Redis: longer than a request's deadline, a person waits for it.
READ_TIMEOUT_S = 5.0

_SPEND_SINCE = "SELECT coalesce(sum(cost_nanos), 0) FROM usage WHERE key = ? AND started_at >= ?"
# Since a recent time (today): the rows of that time, by their own index. Left to itself SQLite
# walks the spend index in key order, every row of the ledger (1.4 s on 5 million, 17 ms so).
_BY_KEY_SINCE = (
    "SELECT key, sum(cost_nanos) FROM usage INDEXED BY usage_started_at "
    "WHERE started_at >= ? AND key IS NOT NULL GROUP BY key"
)


def open_readonly(path: str) -> sqlite3.Connection:
    """The ledger at ``path``, read-only (the gateway writes it meanwhile, in WAL mode).
    Blocking: call it from a worker thread."""
    if not Path(path).is_file():
        raise sqlite3.OperationalError(f"no ledger at {path}")
    uri = f"file:{pathname2url(str(Path(path).resolve()))}?mode=ro"
    return sqlite3.connect(uri, uri=True, check_same_thread=False)


def has_costs(conn: sqlite3.Connection) -> bool:
    """Whether the ledger records costs (a ledger an older gateway wrote has no such column:
    nothing it recorded was billed by it)."""
    return any(row[1] == "cost_nanos" for row in conn.execute("PRAGMA table_info(usage)"))


def spend_since(conn: sqlite3.Connection, key: str, since: float) -> int:
    """What ``key``'s requests that started at ``since`` or later cost, in nanos."""
    if not has_costs(conn):
        return 0
    (spent,) = conn.execute(_SPEND_SINCE, (key, since)).fetchone()
    return int(spent)


def spend_by_key_since(conn: sqlite3.Connection, since: float) -> dict[str, int]:
    """Each key's cost since ``since`` (keys that spent nothing are left out)."""
    if not has_costs(conn):
        return {}
    return {key: int(spent) for key, spent in conn.execute(_BY_KEY_SINCE, (since,)) if spent}


class LedgerSpend:
    """Reads spend from one ledger file, off the event loop, one query at a time, on a
    read-only connection opened at the first query."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = trio.Lock()

    def _connection(self) -> sqlite3.Connection | None:
        """None while the file does not exist: no request was recorded yet, so nothing was
        spent (with [server] workers, the supervisor reads before its workers create it)."""
        if self._conn is None:
            if not Path(self.path).exists():
                return None
            self._conn = open_readonly(self.path)
        return self._conn

    async def since(self, key: str, since: float) -> int:
        """``admission.Seeder``: ``key``'s spend since ``since``."""
        async with self._lock:
            return await trio.to_thread.run_sync(lambda: self._since(key, since))

    def _since(self, key: str, since: float) -> int:
        conn = self._connection()
        return 0 if conn is None else spend_since(conn, key, since)

    async def many_since(self, wanted: Sequence[tuple[str, float]]) -> list[int]:
        """Each ``(key, since)``'s spend, in one trip to a worker thread."""
        async with self._lock:
            return await trio.to_thread.run_sync(lambda: [self._since(k, s) for k, s in wanted])

    async def by_key_since(self, since: float) -> dict[str, int]:
        async with self._lock:
            return await trio.to_thread.run_sync(lambda: self._by_key_since(since))

    def _by_key_since(self, since: float) -> dict[str, int]:
        conn = self._connection()
        return {} if conn is None else spend_by_key_since(conn, since)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@attrs.frozen(kw_only=True)
class Rebuilt:
    """What a start-up rebuild did, for its log line."""

    keys: int  # keys with a budget, each seeded
    spent: int  # their spend in their current periods, in nanos, all together
    seconds: float


async def seed_keys(
    limits: Limits, spend: LedgerSpend, keys: Iterable[ApiKey], *, now: float
) -> Rebuilt:
    """At start: each key with a budget gets its spend in its current period from the ledger
    (the in-process store; with Redis, Redis keeps spend and nothing is read)."""
    store = limits.store
    budgeted = [k for k in keys if k.budget is not None]
    if not isinstance(store, MemoryStore) or not budgeted:
        return Rebuilt(keys=0, spent=0, seconds=0.0)
    periods = [period_of(k.budget_period, now) for k in budgeted]
    started = time.perf_counter()
    amounts = await spend.many_since(
        [(k.name, p.start) for k, p in zip(budgeted, periods, strict=True)]
    )
    for key, period, amount in zip(budgeted, periods, amounts, strict=True):
        store.seed(key.name, period, amount)
    return Rebuilt(keys=len(budgeted), spent=sum(amounts), seconds=time.perf_counter() - started)


async def open_spend(
    limits: Limits, ledger: str | None, keys: Sequence[ApiKey], *, why_none: str, now: float
) -> LedgerSpend | None:
    """Where spend lives, said at start (one line): with Redis, there (nothing to read); else
    in this process, rebuilt from the usage ledger ``ledger`` (None: no ledger file, and
    ``why_none`` says why; a restart then resets every budget). Returns the ledger's reader,
    which :class:`Limits` also uses for a key it meets later; the caller closes it."""
    budgets = sum(1 for k in keys if k.budget is not None)
    if not isinstance(limits.store, MemoryStore):
        return None
    if ledger is None:
        log.log(
            logging.WARNING if budgets else logging.INFO,
            "limits: budgets and rate limits in this process only, with no ledger to rebuild "
            "spend from (%s): a restart resets every budget (%s)",
            why_none,
            counted(budgets, "key") + " with a budget",
        )
        return None
    spend = LedgerSpend(ledger)
    try:
        rebuilt = await seed_keys(limits, spend, keys, now=now)
    except sqlite3.Error as exc:
        spend.close()
        log.error("limits: spend could not be read from the usage ledger %s: %s", ledger, exc)
        return None
    limits.seeder = spend.since
    log.info(
        "limits: budgets and rate limits in this process; spend of %s with a budget rebuilt "
        "from the usage ledger %s in %.3f s (%s spent in their current periods): a restart "
        "keeps it, other replicas do not share it ([redis] does)",
        counted(rebuilt.keys, "key"),
        ledger,
        rebuilt.seconds,
        exact_units(rebuilt.spent),
    )
    return spend


# Reading spend from a shell (`keys list`, `usage --reconcile`): where the gateway keeps it.


@attrs.frozen(kw_only=True)
class KeySpend:
    """One key with a budget: what it spent in its current period, where spend lives."""

    key: ApiKey
    period: Period
    spent: int | None  # nanos; None: could not be read (``SpendReading.problem`` says why)

    @property
    def remaining(self) -> int | None:
        if self.spent is None or self.key.budget is None:
            return None
        return max(nanos(self.key.budget) - self.spent, 0)


@attrs.frozen(kw_only=True)
class SpendReading:
    source: str  # "redis://HOST:PORT/DB" or "the usage ledger PATH"
    keys: tuple[KeySpend, ...]
    problem: str | None = None


def ledger_spend(path: str, keys: Sequence[ApiKey], *, now: float) -> SpendReading:
    """Each budgeted key's spend in its current period, from the ledger at ``path``."""
    budgeted = [k for k in keys if k.budget is not None]
    periods = [period_of(k.budget_period, now) for k in budgeted]
    # No ledger yet: the gateway never ran with it, so nothing was spent.
    amounts: list[int | None] = [0] * len(budgeted)
    problem = None
    if Path(path).exists():
        try:
            conn = open_readonly(path)
            try:
                starts = zip(budgeted, periods, strict=True)
                amounts = [spend_since(conn, k.name, p.start) for k, p in starts]
            finally:
                conn.close()
        except sqlite3.Error as exc:
            amounts, problem = [None] * len(budgeted), str(exc)
    return _reading(f"the usage ledger {path}", budgeted, periods, amounts, problem)


def _reading(
    source: str,
    keys: Sequence[ApiKey],
    periods: Sequence[Period],
    amounts: Sequence[int | None],
    problem: str | None,
) -> SpendReading:
    spends = zip(keys, periods, amounts, strict=True)
    return SpendReading(
        source=source,
        keys=tuple(KeySpend(key=k, period=p, spent=a) for k, p, a in spends),
        problem=problem,
    )


async def redis_spend(config: GatewayConfig, keys: Sequence[ApiKey], *, now: float) -> SpendReading:
    """Each budgeted key's spend in its current period, from ``config``'s Redis."""
    redis = config.redis
    assert redis is not None
    budgeted = [k for k in keys if k.budget is not None]
    periods = [period_of(k.budget_period, now) for k in budgeted]
    source = parse_redis_url(redis.url).display()
    amounts: list[int | None] = []
    problem = None
    async with open_redis(redis.url, ca_file=redis.ca_file, cluster=redis.cluster) as client:
        store = RedisStore(client, redis.key_prefix)
        for key, period in zip(budgeted, periods, strict=True):
            try:
                with trio.fail_after(max(redis.timeout_s, READ_TIMEOUT_S)):
                    amounts.append(await store.spent_in(key.name, period))
            except (RedisError, trio.TooSlowError) as exc:
                problem = str(exc) or "no answer in time"
                amounts.append(None)
    return _reading(source, budgeted, periods, amounts, problem)
