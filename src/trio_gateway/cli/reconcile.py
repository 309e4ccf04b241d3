"""``trio-gateway usage --reconcile``: with Redis, spend lives in Redis (shared by the
replicas, the truth budgets are checked against); the usage ledger records what each request
cost. This compares the two for each key with a budget, in its current period.

They differ, and this says by how much, when: requests were served while Redis was down
(``fail_open``: recorded, not billed), a replica died mid-request (its hold expired, its cost is
lost to the budget, the ledger has the record), each replica keeps its own ledger (compare the
sum of theirs), or the key's budget period changed (Redis counts from the change).
"""

from __future__ import annotations

import sys
import time
from functools import partial

import trio

from trio_gateway.accounting.ledger import LEDGER_MEMORY, ledger_path
from trio_gateway.accounting.limits import format_units
from trio_gateway.accounting.spend import ledger_spend, redis_spend
from trio_gateway.config.load import load_config
from trio_gateway.config.schema import ConfigError
from trio_gateway.core.keys import KeysFileError, load_keys

EXIT_DIFFERENT = 1
EXIT_USAGE = 2
HEADER = ("key", "period", "redis", "ledger", "difference")


def reconcile(config_path: str) -> int:
    """0 when Redis and the ledger agree on every budgeted key, 1 when one differs (the table
    says which), 2 when they cannot be compared."""
    try:
        config = load_config(config_path, secrets=False)
    except ConfigError as exc:
        return _fail(f"{exc.source}: {'; '.join(exc.problems)}")
    if config.redis is None:
        return _fail(
            f"{config_path} has no [redis]: spend lives in the gateway's process and is rebuilt "
            "from the ledger itself; there is nothing to reconcile"
        )
    ledger = ledger_path(config)
    if ledger is None or ledger == LEDGER_MEMORY or config.auth.keys_file is None:
        return _fail(f"{config_path} keeps no usage ledger file or no keys file to compare")
    try:
        keys = list(load_keys(config.auth.keys_file))
    except KeysFileError as exc:
        return _fail(str(exc))
    now = time.time()
    in_redis = trio.run(partial(redis_spend, config, keys, now=now))
    in_ledger = ledger_spend(ledger, keys, now=now)
    for reading in (in_redis, in_ledger):
        if reading.problem is not None:
            return _fail(f"{reading.source}: {reading.problem}")
    print(f"redis: {in_redis.source}; ledger: {ledger}")
    rows = []
    differs = False
    for theirs, ours in zip(in_redis.keys, in_ledger.keys, strict=True):
        redis_nanos, ledger_nanos = theirs.spent or 0, ours.spent or 0
        differs = differs or redis_nanos != ledger_nanos
        rows.append(
            (
                theirs.key.name,
                theirs.period.id,
                format_units(redis_nanos),
                format_units(ledger_nanos),
                _signed(redis_nanos - ledger_nanos),
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADER)]
    for row in (HEADER, *rows):
        print(
            "  ".join(
                v.ljust(w) if i < 2 else v.rjust(w)
                for i, (v, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
    return EXIT_DIFFERENT if differs else 0


def _signed(nanos: int) -> str:
    return ("-" if nanos < 0 else "+" if nanos else "") + format_units(abs(nanos))


def _fail(message: str) -> int:
    print(f"trio-gateway usage --reconcile: {message}", file=sys.stderr)
    return EXIT_USAGE
