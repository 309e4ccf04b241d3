"""``trio-gateway usage``: the SQLite usage ledger as a table, or as JSON lines.

::

    trio-gateway usage [--by key|alias|provider|endpoint|priority|day]
                       [--since 24h|2026-01-31T00:00] [--ledger PATH | --config FILE] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
import time
from datetime import datetime
from pathlib import Path
from urllib.request import pathname2url

from trio_gateway.accounting.ledger import COLUMNS, LEDGER_MEMORY, ledger_path
from trio_gateway.accounting.limits import format_units
from trio_gateway.cli.reconcile import reconcile
from trio_gateway.config.load import load_config
from trio_gateway.config.schema import DEFAULT_CONFIG_NAME, ConfigError

EXIT_USAGE = 2
GROUPS = {
    "key": "coalesce(key, '-')",
    "alias": "coalesce(alias, '-')",
    "provider": "coalesce(provider, '-')",
    "endpoint": "endpoint",  # chat, completions, embeddings
    "priority": "coalesce(priority, '-')",  # '-': refused before its class was known
    "day": "date(started_at, 'unixepoch')",  # UTC
}
UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
HEADERS = (
    "requests",
    "completed",
    "cancelled",
    "failed",
    "refused",
    "prompt",
    "completion",
    "reasoning",
    "cached",
    "estimated",
    "cost",
)


def parse_since(value: str, *, now: float) -> float:
    """``24h``, ``30m``, ``7d`` (before ``now``), or an ISO date/time (local time unless it
    names its zone) → seconds since the epoch."""
    match = _DURATION.match(value.strip())
    if match:
        return now - float(match.group(1)) * UNITS_S[match.group(2)]
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since: expected a duration like 24h, 30m, 7d or an ISO date, got {value!r}"
        ) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trio-gateway usage", description="Usage records from the SQLite ledger."
    )
    parser.add_argument("--by", choices=sorted(GROUPS), default="alias", help="default: alias")
    parser.add_argument("--since", help="a duration back from now (24h, 30m, 7d) or an ISO date")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--ledger", help="the ledger file (default: the config's)")
    source.add_argument(
        "--config", default=DEFAULT_CONFIG_NAME, help="config file (default: ./gateway.toml)"
    )
    parser.add_argument("--json", action="store_true", help="one record per line, oldest first")
    parser.add_argument(
        "--reconcile",
        action="store_true",
        help="with [redis]: each budgeted key's spend in Redis against the ledger's, in its "
        "current period (exit status 1 when they differ)",
    )
    return parser


def _resolve(args: argparse.Namespace) -> str:
    if args.ledger is not None:
        return str(args.ledger)
    try:
        config = load_config(args.config, secrets=False)
    except ConfigError as exc:
        raise SystemExit(f"trio-gateway usage: {exc.source}: {'; '.join(exc.problems)}") from None
    path = ledger_path(config)
    if path is None:
        raise SystemExit(f"trio-gateway usage: {args.config} turns the ledger off (ledger = none)")
    if path == LEDGER_MEMORY:
        raise SystemExit(f"trio-gateway usage: {args.config} keeps records in memory only")
    return path


def _connect(path: str) -> sqlite3.Connection:
    if not Path(path).is_file():
        raise SystemExit(f"trio-gateway usage: no ledger at {path}")
    try:
        conn = sqlite3.connect(f"file:{pathname2url(str(Path(path).resolve()))}?mode=ro", uri=True)
        conn.execute("SELECT 1 FROM usage LIMIT 1")
    except sqlite3.Error as exc:
        raise SystemExit(f"trio-gateway usage: {path}: not a usage ledger ({exc})") from None
    return conn


def _with_endpoint(conn: sqlite3.Connection, expression: str) -> str:
    """``expression`` where it names the endpoint column of a ledger an older gateway wrote
    (opened read-only here, so not migrated): every record of it was a chat's."""
    present = {name for _, name, *_ in conn.execute("PRAGMA table_info(usage)")}
    if "endpoint" not in present:
        expression = expression.replace("endpoint", "'chat'")
    if "filtered" not in present:  # before output filters: none acted
        expression = expression.replace("filtered", "NULL")
    if "priority" not in present:  # before priority classes
        expression = expression.replace("priority", "NULL")
    if "dropped_tools" not in present:  # before the agent fronts: none dropped
        expression = expression.replace("dropped_tools", "NULL")
    if "cost_nanos" not in present:  # before costs were recorded: none known
        expression = expression.replace("cost_nanos", "0")
    return expression


def table(conn: sqlite3.Connection, by: str, since: float | None) -> list[tuple[object, ...]]:
    columns = _with_endpoint(
        conn,
        f"""{GROUPS[by]} AS grp, count(*),
               sum(outcome = 'completed'), sum(outcome = 'cancelled'),
               sum(outcome = 'failed'), sum(outcome = 'refused'),
               sum(prompt_tokens), sum(completion_tokens), sum(reasoning_tokens),
               sum(cached_tokens), sum(estimated), sum(cost_nanos)""",
    )
    query = f"SELECT {columns} FROM usage WHERE started_at >= ? GROUP BY grp ORDER BY grp"
    return list(conn.execute(query, (since if since is not None else float("-inf"),)))


def records(conn: sqlite3.Connection, since: float | None) -> list[dict[str, object]]:
    columns = _with_endpoint(conn, ", ".join(COLUMNS))
    query = f"SELECT {columns} FROM usage WHERE started_at >= ? ORDER BY started_at, id"
    out = []
    for values in conn.execute(query, (since if since is not None else float("-inf"),)):
        record = dict(zip(COLUMNS, values, strict=True))
        record["estimated"] = bool(record["estimated"])
        out.append(record)
    return out


def render_table(by: str, rows: list[tuple[object, ...]]) -> str:
    """The rows of :func:`table` and their total; the cost (its last column, in nanos) in the
    prices' unit."""
    header = (by, *HEADERS)
    counts = [[int(v or 0) for v in r[1:]] for r in rows]  # type: ignore[call-overload]
    if rows:
        counts.append([sum(column) for column in zip(*counts, strict=True)])
    names = [str(r[0]) for r in rows] + (["total"] if rows else [])
    cells = [
        (name, *(str(n) for n in values[:-1]), format_units(values[-1]))
        for name, values in zip(names, counts, strict=True)
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    lines = []
    for line in [header, *cells]:
        padded = [line[0].ljust(widths[0])]
        padded += [v.rjust(w) for v, w in zip(line[1:], widths[1:], strict=True)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def usage_main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.reconcile:
        return reconcile(args.config)
    try:
        since = parse_since(args.since, now=time.time()) if args.since else None
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    try:
        conn = _connect(_resolve(args))
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.json:
            for record in records(conn, since):
                print(json.dumps(record, ensure_ascii=False))
        else:
            print(render_table(args.by, table(conn, args.by, since)))
    finally:
        conn.close()
    return 0
