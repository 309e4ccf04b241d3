"""``trio-gateway keys new | list``: create API keys and show who has one.

Both find the keys file as the gateway does: ``--keys-file``, else the ``[auth] keys_file`` of
the config (``--config``, else ./gateway.toml). ``new`` checks ``--aliases`` against that
config's aliases: a keys file naming an alias the config lacks is refused whole by the gateway.

``new`` prints the key once, alone on its last line (``keys new ... | tail -n 1``), and writes
only its SHA-256 to the keys file: appended as a new table, so comments and the other entries
stay as they were, through a temporary file renamed over the old one (mode 0600), so
a gateway re-reading the file never sees half of it. ``list`` never shows a key or a hash.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import trio

from trio_gateway.accounting.ledger import LEDGER_MEMORY, ledger_path
from trio_gateway.accounting.limits import format_units
from trio_gateway.accounting.spend import KeySpend, SpendReading, ledger_spend, redis_spend
from trio_gateway.config.load import ConfigOutline, load_config, outline_config
from trio_gateway.config.schema import DEFAULT_CONFIG_NAME, ConfigError
from trio_gateway.core.budget_period import BUDGET_PERIODS, NO_PERIOD
from trio_gateway.core.keys import (
    NAME_PATTERN,
    ApiKey,
    KeyRing,
    KeysFileError,
    hash_key,
    new_key,
    parse_keys,
    read_keys_file,
)
from trio_gateway.core.priority import PRIORITY_MAX, PRIORITY_MIN, PRIORITY_RANGE

EXIT_USAGE = 2
FILE_MODE = 0o600
NEW_FILE_HEADER = """\
# trio-gateway API keys (docs/accounting.md): one [keys.NAME] table per key, holding the
# SHA-256 of the key, never the key. Written by `trio-gateway keys new`; a running gateway
# re-reads this file within a second of a change.
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, got {text!r}")
    return value


def _priority(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise argparse.ArgumentTypeError(PRIORITY_RANGE)
    return value


def _aliases(text: str) -> tuple[str, ...]:
    aliases = tuple(a.strip() for a in text.split(",") if a.strip())
    if len(set(aliases)) != len(aliases):
        raise argparse.ArgumentTypeError(f"an alias is listed twice in {text!r}")
    return aliases


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trio-gateway keys", description="Manage API keys.")
    commands = parser.add_subparsers(dest="command", required=True)
    new = commands.add_parser("new", help="create a key; print it once, on the last line")
    new.add_argument("name", help="the key's name: 1 to 64 of A-Z a-z 0-9 _ -")
    _file_arguments(new, "the keys file (created if missing)")
    new.add_argument(
        "--aliases",
        type=_aliases,
        default=(),
        help="comma-separated aliases, each one the config has (default: all)",
    )
    new.add_argument("--rpm", type=_positive_int, help="requests per minute (stored)")
    new.add_argument("--tpm", type=_positive_int, help="tokens per minute (stored)")
    new.add_argument("--budget", type=_budget, help="spending budget, in the prices' unit")
    new.add_argument(
        "--budget-period",
        choices=BUDGET_PERIODS,
        help="the budget renews each UTC day, week (from Monday) or month; none (default): "
        "it is for the key's whole life",
    )
    new.add_argument(
        "--admin",
        action="store_true",
        help="the key may also read /status.json and /metrics (the operator's endpoints)",
    )
    new.add_argument(
        "--priority",
        type=_priority,
        help="its requests' priority class, lower first (default: the alias's priority)",
    )
    listing = commands.add_parser(
        "list", help="the keys' names, limits and spend (in each budget's period), never the keys"
    )
    _file_arguments(listing, "the keys file")
    return parser


def _file_arguments(command: argparse.ArgumentParser, keys_file: str) -> None:
    command.add_argument(
        "--keys-file", help=f"{keys_file} (default: the config's [auth] keys_file)"
    )
    command.add_argument(
        "--config",
        help="the gateway's config, for its aliases and keys file "
        f"(default: ./{DEFAULT_CONFIG_NAME} when there is one)",
    )


def _outline(args: argparse.Namespace, *, aliases: bool) -> ConfigOutline | None:
    """The config that reads this keys file: ``--config``, else ./gateway.toml if there is
    one (as ``serve`` and ``check`` find it), else None; not read when nothing needs it (a
    ``--keys-file`` and no ``aliases`` to check). Raises ConfigError."""
    if args.config is None and args.keys_file is not None and not aliases:
        return None
    if args.config is None and not Path(DEFAULT_CONFIG_NAME).is_file():
        return None
    return outline_config(args.config or DEFAULT_CONFIG_NAME)


def _keys_path(args: argparse.Namespace, outline: ConfigOutline | None) -> Path | None:
    if args.keys_file is not None:
        return Path(args.keys_file)
    if outline is not None and outline.keys_file is not None:
        return Path(outline.keys_file)
    return None


def _locate(
    args: argparse.Namespace, *, aliases: bool = False
) -> tuple[Path, ConfigOutline | None] | int:
    """The keys file and the config it belongs to, or the exit status after saying why not."""
    try:
        outline = _outline(args, aliases=aliases)
    except ConfigError as exc:
        return _fail(exc.source, exc.problems)
    path = _keys_path(args, outline)
    if path is None:
        where = (
            f"{outline.source} has no [auth] keys_file"
            if outline is not None
            else f"no {DEFAULT_CONFIG_NAME} here"
        )
        print(f"trio-gateway keys: {where}; give --keys-file PATH", file=sys.stderr)
        return EXIT_USAGE
    return path, outline


def _alias_problem(aliases: tuple[str, ...], outline: ConfigOutline | None) -> str | None:
    """Why ``--aliases`` cannot be stored: a gateway refuses a keys file naming an alias its
    config lacks, and while serving it would keep the keys it had, so the new one gets 401."""
    if not aliases:
        return None
    if outline is None:
        return (
            f"--aliases: no {DEFAULT_CONFIG_NAME} here to check them against; give --config "
            "FILE (the config that reads this keys file)"
        )
    unknown = [a for a in aliases if a not in outline.aliases]
    if not unknown:
        return None
    names = ", ".join(repr(a) for a in unknown)
    return (
        f"--aliases: unknown alias{'es' if len(unknown) > 1 else ''} {names} "
        f"(known in {outline.source}: {', '.join(outline.aliases)})"
    )


def _fail(source: str, problems: list[str]) -> int:
    for problem in problems:
        print(f"{source}: {problem}", file=sys.stderr)
    return EXIT_USAGE


def _read_ring(path: Path) -> tuple[str, KeyRing]:
    text = read_keys_file(path)
    return text, parse_keys(text, source=str(path))


def _entry_toml(
    name: str,
    digest_hex: str,
    aliases: tuple[str, ...],
    rpm: int | None,
    tpm: int | None,
    budget: float | None,
    priority: int | None = None,
    budget_period: str | None = None,
    admin: bool = False,
) -> str:
    # JSON's string escapes are valid in TOML basic strings.
    lines = [f"[keys.{name}]", f'sha256 = "{digest_hex}"']
    if aliases:
        lines.append(f"aliases = [{', '.join(json.dumps(a) for a in aliases)}]")
    if rpm is not None:
        lines.append(f"rpm = {rpm}")
    if tpm is not None:
        lines.append(f"tpm = {tpm}")
    if budget is not None:
        lines.append(f"budget = {budget!r}")
    if budget_period is not None:
        lines.append(f'budget_period = "{budget_period}"')
    if priority is not None:
        lines.append(f"priority = {priority}")
    if admin:
        lines.append("admin = true")
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a temporary file in the same directory, mode 0600,
    flushed to disk, then renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _describe(key: ApiKey) -> str:
    """A key's aliases and limits, as ``keys new`` and ``keys list`` say them."""

    def show(value: object) -> str:
        return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    return (
        f"aliases: {', '.join(key.aliases) if key.aliases else 'all'}; "
        f"rpm: {show(key.rpm)}; tpm: {show(key.tpm)}; budget: {show(key.budget)}"
        + ("" if key.budget is None else f"; period: {key.budget_period}")
        + ("" if key.priority is None else f"; priority: {key.priority}")
        + ("; admin" if key.admin else "")
    )


def _spent(spend: KeySpend | None) -> str:
    """What a budgeted key spent in its period and what is left, as ``keys list`` says it."""
    if spend is None:
        return ""
    renews = spend.period.renews_at()
    left = spend.remaining
    return (
        ("" if renews is None else f" (renews {renews})")
        + f"; spent: {'?' if spend.spent is None else format_units(spend.spent)}"
        + f"; remaining: {'?' if left is None else format_units(left)}"
    )


def _new(args: argparse.Namespace) -> int:
    located = _locate(args, aliases=bool(args.aliases))
    if isinstance(located, int):
        return located
    path, outline = located
    if not NAME_PATTERN.fullmatch(args.name):
        return _fail(str(path), [f"{args.name!r}: a key's name is 1 to 64 of A-Z a-z 0-9 _ -"])
    if (problem := _alias_problem(args.aliases, outline)) is not None:
        return _fail(str(path), [problem, "nothing written"])
    text = ""
    if path.exists():
        try:
            text, ring = _read_ring(path)
        except KeysFileError as exc:
            return _fail(exc.source, [*exc.problems, "nothing written"])
        if any(key.name == args.name for key in ring):
            return _fail(str(path), [f"a key named {args.name!r} already exists"])
    if args.budget_period not in (None, NO_PERIOD) and args.budget is None:
        return _fail(str(path), ["--budget-period needs --budget", "nothing written"])
    key = new_key()
    entry = _entry_toml(
        args.name,
        hash_key(key),
        args.aliases,
        args.rpm,
        args.tpm,
        args.budget,
        args.priority,
        args.budget_period,
        args.admin,
    )
    if not text.strip():
        text = NEW_FILE_HEADER
    new_text = text + ("" if text.endswith("\n") else "\n") + "\n" + entry
    found = parse_keys(new_text, source=str(path)).lookup(key)
    if found is None or found.name != args.name:
        return _fail(str(path), ["the new entry does not read back; nothing written"])
    try:
        write_atomically(path, new_text)
    except OSError as exc:
        return _fail(str(path), [f"cannot write: {exc.strerror or exc}"])
    print(f"created key {args.name!r} in {path} ({_describe(found)})")
    print("the key is shown this once; the file keeps only its SHA-256:")
    print(key)
    return 0


def _list(args: argparse.Namespace) -> int:
    located = _locate(args)
    if isinstance(located, int):
        return located
    path, _ = located
    try:
        _, ring = _read_ring(path)
    except KeysFileError as exc:
        return _fail(exc.source, exc.problems)
    if not len(ring):
        print(f"{path}: no keys")
        return 0
    reading = _read_spend(args, ring)
    spends = {s.key.name: s for s in reading.keys} if reading is not None else {}
    if reading is not None:
        print(f"spend: from {reading.source}, in each budget's current period")
        if reading.problem is not None:
            print(f"trio-gateway keys: spend unknown: {reading.problem}", file=sys.stderr)
    for key in sorted(ring, key=lambda k: k.name):
        print(f"{key.name}  ({_describe(key)}{_spent(spends.get(key.name))})")
    return 0


def _read_spend(args: argparse.Namespace, ring: KeyRing) -> SpendReading | None:
    """Where the gateway of ``--config`` (else ./gateway.toml) keeps spend, read: Redis, else
    its usage ledger. None when no key has a budget or there is no config to say where."""
    if not any(k.budget is not None for k in ring):
        return None
    # A --keys-file alone may not be ./gateway.toml's: its spend is read with --config only.
    source = args.config
    if source is None and args.keys_file is None and Path(DEFAULT_CONFIG_NAME).is_file():
        source = DEFAULT_CONFIG_NAME
    if source is None:
        return None
    try:
        config = load_config(source, secrets=False)
    except ConfigError as exc:
        print(
            f"trio-gateway keys: spend not shown: {exc.source}: {exc.problems[0]}", file=sys.stderr
        )
        return None
    now = time.time()
    if config.redis is not None:
        return trio.run(partial(redis_spend, config, list(ring), now=now))
    ledger = ledger_path(config)
    if ledger is None or ledger == LEDGER_MEMORY:
        print(
            f"trio-gateway keys: spend not shown: {source} keeps no usage ledger file",
            file=sys.stderr,
        )
        return None
    return ledger_spend(ledger, list(ring), now=now)


def keys_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "new":
        return _new(args)
    return _list(args)
