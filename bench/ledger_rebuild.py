"""How long a gateway without Redis takes to rebuild its keys' spend from a usage ledger of
millions of records (docs/accounting.md, "Where spend lives").

::

    python -m bench.ledger_rebuild --records 5000000 --keys 200 --days 90 --ledger /tmp/l.sqlite3

writes a ledger of ``--records`` rows (``--keys`` keys, one request every few seconds over
``--days`` days up to now, a price on each), then times what a start does with it: open it as
the gateway does (``ledger.connect``: the schema, the migration, the spend index), rebuild each
key's spend in its budget period (``spend.seed_keys``: a third of the keys by day, a third by
month, a third for their whole life) and read today's cost per key (the status page's top keys).
An existing file is reused, so the writing is paid once.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import time
from pathlib import Path

import trio

from trio_gateway.accounting.admission import local_limits
from trio_gateway.accounting.ledger import COLUMNS, SCHEMA, connect
from trio_gateway.accounting.spend import LedgerSpend, seed_keys
from trio_gateway.core.budget_period import period_of
from trio_gateway.core.keys import ApiKey

BATCH = 50_000
PERIODS = ("day", "month", "none")


def write_ledger(path: Path, records: int, keys: int, days: float, now: float) -> float:
    """A ledger as a gateway writes it (its schema, then rows in batches); seconds taken."""
    started = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(SCHEMA)
    rng = random.Random(42)
    first = now - days * 86400
    step = days * 86400 / records
    insert = f"INSERT INTO usage ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    for offset in range(0, records, BATCH):
        rows = []
        for i in range(offset, min(offset + BATCH, records)):
            prompt, completion = rng.randint(50, 4000), rng.randint(1, 1000)
            rows.append(
                (f"r{i}", f"key-{rng.randrange(keys)}", "agent-lite", "vllm", "completed",
                 None, prompt, completion, 0, 0, 0, 0.2, 1.5, first + i * step, "chat",
                 None, 0, None, prompt * 400 + completion * 1600)
            )  # fmt: skip
        conn.execute("BEGIN")
        conn.executemany(insert, rows)
        conn.execute("COMMIT")
    conn.close()
    return time.perf_counter() - started


async def rebuild(path: Path, keys: int, now: float) -> None:
    started = time.perf_counter()
    conn = await trio.to_thread.run_sync(connect, str(path))  # the spend index, if missing
    opened = time.perf_counter() - started
    await trio.to_thread.run_sync(conn.close)
    ring = [
        ApiKey(name=f"key-{i}", digest=b"", budget=100.0, budget_period=PERIODS[i % 3])
        for i in range(keys)
    ]
    limits = local_limits()
    spend = LedgerSpend(str(path))
    rebuilt = await seed_keys(limits, spend, ring, now=now)
    started = time.perf_counter()
    today = await spend.by_key_since(period_of("day", now).start)
    today_s = time.perf_counter() - started
    spend.close()
    print(f"open (schema, migration, spend index): {opened:.3f} s")
    print(
        f"rebuild: {rebuilt.keys} keys in {rebuilt.seconds:.3f} s "
        f"({rebuilt.seconds / max(rebuilt.keys, 1) * 1000:.2f} ms a key)"
    )
    print(f"today's cost per key: {len(today)} keys in {today_s:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--days", type=float, default=90.0)
    parser.add_argument(
        "--ledger", type=Path, default=Path("/tmp/trio-gateway-bench-ledger.sqlite3")
    )
    args = parser.parse_args()
    now = time.time()
    if not args.ledger.exists():
        took = write_ledger(args.ledger, args.records, args.keys, args.days, now)
        print(f"wrote {args.records} records in {took:.1f} s")
    size = args.ledger.stat().st_size
    print(f"ledger: {args.ledger} ({size / 1e6:.0f} MB)")
    trio.run(rebuild, args.ledger, args.keys, now)


if __name__ == "__main__":
    main()
