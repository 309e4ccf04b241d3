"""API keys: the keys file, the ring of keys it holds, and its reload while serving.

The keys file is TOML, one table per key, holding the SHA-256 of the key and never the key::

    [keys.alice]
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    aliases = ["agent-lite"]      # absent or empty: every alias
    rpm = 60                      # optional; stored for rate limits and budgets (not yet used)
    tpm = 100000
    budget = 25.0
    budget_period = "month"       # optional: day, week, month (UTC calendar) or none (default)
    priority = 0                  # optional; lower first (docs/accounting.md); else the alias's
    admin = false                 # optional: true lets the key read /status.json and /metrics

Keys are 256 random bits (``secrets.token_urlsafe``), so one SHA-256 is the right hash: there
is nothing for a slow password hash to protect. A presented key is hashed, then compared with
every stored hash with ``hmac.compare_digest`` and no early exit, so how long a lookup takes
depends neither on where a stored hash differs nor on which key matched.

Parsing is strict, like ``gateway.toml``'s: unknown keys, wrong types and bad values are
errors, every problem is reported at once with its dotted path, and no message quotes a hash.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import re
import secrets
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import tomli

from trio_gateway.core.budget_period import BUDGET_PERIODS, NO_PERIOD
from trio_gateway.core.errors import Forbidden
from trio_gateway.core.priority import PRIORITY_MAX, PRIORITY_MIN, PRIORITY_RANGE

log = logging.getLogger("trio_gateway")

KEY_PREFIX = "tgw-"
KEY_RANDOM_BYTES = 32  # 256 bits; token_urlsafe writes them in 43 characters
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_ENTRY_KEYS = ("sha256", "aliases", "rpm", "tpm", "budget", "budget_period", "priority", "admin")


@attrs.frozen(kw_only=True)
class ApiKey:
    """One key's entry: who it is and what it may do. The digest is never shown."""

    name: str
    digest: bytes = attrs.field(repr=False)
    # Empty: every alias.
    aliases: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None
    budget: float | None = None
    # The budget renews each UTC calendar day, week or month; "none": it is for the key's life.
    budget_period: str = NO_PERIOD
    # Its requests' priority class (core/priority.py); None: the alias's.
    priority: int | None = None
    # May read the operator's endpoints (/status.json, /metrics) when keys are required.
    admin: bool = False

    def allows(self, alias: str) -> bool:
        return not self.aliases or alias in self.aliases

    def check_alias(self, alias: str) -> None:
        """Raise 403 ``alias_not_allowed`` unless this key may use ``alias``."""
        if not self.allows(alias):
            raise Forbidden(
                f"this API key may not use {alias!r}; it may use: {', '.join(self.aliases)}",
                param="model",
            )


class KeysFileError(Exception):
    """Every problem found in one keys file; ``keys``: the names of the entries that have one
    (empty when the file as a whole is the problem: unreadable, not TOML)."""

    def __init__(self, source: str, problems: list[str], keys: Iterable[str] = ()) -> None:
        self.source = source
        self.problems = problems
        self.keys = tuple(keys)
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def new_key() -> str:
    """A fresh API key: recognisable by its prefix, 256 random bits."""
    return KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)


def hash_key(key: str) -> str:
    """The hex SHA-256 of a key, as the keys file stores it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyRing:
    """The keys of one keys file, looked up by the key a caller presents. Immutable."""

    def __init__(self, keys: Iterable[ApiKey] = ()) -> None:
        self._keys = tuple(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[ApiKey]:
        return iter(self._keys)

    def lookup(self, presented: str) -> ApiKey | None:
        digest = hashlib.sha256(presented.encode("utf-8")).digest()
        found: ApiKey | None = None
        for key in self._keys:
            # No break: every stored digest is compared, each in constant time.
            if hmac.compare_digest(key.digest, digest):
                found = key
        return found


# Parsing: one pass, every problem with its path.


def _kind(value: object) -> str:
    return repr(value) if isinstance(value, str | int | float | bool) else type(value).__name__


def _entry(
    name: str, raw: object, known_aliases: Collection[str] | None
) -> tuple[ApiKey | None, list[str]]:
    where = f"keys.{name}"
    problems: list[str] = []
    if not NAME_PATTERN.fullmatch(name):
        problems.append(f"{where}: a key's name is 1 to 64 of A-Z a-z 0-9 _ -")
    if not isinstance(raw, dict):
        return None, [*problems, f"{where}: expected a table, got {_kind(raw)}"]
    extra = sorted(set(raw) - set(_ENTRY_KEYS))
    if extra:
        plural = "s" if len(extra) > 1 else ""
        problems.append(f"{where}: unknown key{plural} " + ", ".join(repr(k) for k in extra))
    sha = raw.get("sha256")
    digest = b""
    if sha is None:
        problems.append(f"{where}.sha256: required field missing")
    elif type(sha) is not str:
        problems.append(f"{where}.sha256: expected a string, got {_kind(sha)}")
    elif not _SHA256_HEX.fullmatch(sha):
        # The value is not quoted: it may be a key pasted by mistake.
        problems.append(f"{where}.sha256: expected 64 lowercase hex digits (a SHA-256)")
    else:
        digest = bytes.fromhex(sha)
    aliases: tuple[str, ...] = ()
    raw_aliases = raw.get("aliases", [])
    if not isinstance(raw_aliases, list):
        problems.append(f"{where}.aliases: expected a list of strings, got {_kind(raw_aliases)}")
    else:
        for i, alias in enumerate(raw_aliases):
            if type(alias) is not str:
                problems.append(f"{where}.aliases[{i}]: expected a string, got {_kind(alias)}")
            elif known_aliases is not None and alias not in known_aliases:
                known = ", ".join(sorted(known_aliases))
                problems.append(f"{where}.aliases[{i}]: unknown alias {alias!r} (known: {known})")
            elif alias in aliases:
                problems.append(f"{where}.aliases[{i}]: {alias!r} is listed twice")
            else:
                aliases += (alias,)
    rpm = _limit(raw, "rpm", where, problems)
    tpm = _limit(raw, "tpm", where, problems)
    budget = raw.get("budget")
    if budget is not None and type(budget) not in (int, float):
        problems.append(f"{where}.budget: expected a number, got {_kind(budget)}")
    elif budget is not None and not (math.isfinite(budget) and budget >= 0):
        problems.append(f"{where}.budget: must be a finite number, 0 or more")
    period = raw.get("budget_period", NO_PERIOD)
    if type(period) is not str or period not in BUDGET_PERIODS:
        problems.append(
            f"{where}.budget_period: expected one of {', '.join(BUDGET_PERIODS)}, "
            f"got {_kind(period)}"
        )
    elif period != NO_PERIOD and budget is None:
        problems.append(
            f"{where}.budget_period: only with a budget (a period of nothing renews nothing)"
        )
    admin = raw.get("admin", False)
    if type(admin) is not bool:
        problems.append(f"{where}.admin: expected true or false, got {_kind(admin)}")
    priority = raw.get("priority")
    if priority is not None and (
        type(priority) is not int or not PRIORITY_MIN <= priority <= PRIORITY_MAX
    ):
        problems.append(f"{where}.priority: {PRIORITY_RANGE}, got {_kind(priority)}")
    if problems:
        return None, problems
    key = ApiKey(
        name=name,
        digest=digest,
        aliases=aliases,
        rpm=rpm,
        tpm=tpm,
        budget=None if budget is None else float(budget),
        budget_period=period,
        priority=priority,
        admin=admin,
    )
    return key, []


def _limit(raw: Mapping[str, Any], field: str, where: str, problems: list[str]) -> int | None:
    value = raw.get(field)
    if value is None:
        return None
    if type(value) is not int:
        problems.append(f"{where}.{field}: expected an integer, got {_kind(value)}")
        return None
    if value < 1:
        problems.append(f"{where}.{field}: must be at least 1")
        return None
    return value


def parse_keys(
    text: str, *, source: str = "<keys>", known_aliases: Collection[str] | None = None
) -> KeyRing:
    """Parse a keys file's text, or raise :class:`KeysFileError` listing every problem.

    With ``known_aliases``, a key naming another alias is a problem too."""
    try:
        raw = tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        raise KeysFileError(source, [f"not valid TOML: {exc}"]) from None
    return _build_ring(raw, source, known_aliases)


def _build_ring(
    raw: Mapping[str, Any], source: str, known_aliases: Collection[str] | None
) -> KeyRing:
    problems: list[str] = []
    extra = sorted(set(raw) - {"keys"})
    if extra:
        plural = "s" if len(extra) > 1 else ""
        problems.append(f"(top level): unknown key{plural} " + ", ".join(repr(k) for k in extra))
    tables = raw.get("keys", {})
    if not isinstance(tables, dict):
        raise KeysFileError(source, [*problems, f"keys: expected a table, got {_kind(tables)}"])
    keys: list[ApiKey] = []
    broken: list[str] = []
    owners: dict[bytes, str] = {}
    for name, entry in tables.items():
        key, entry_problems = _entry(name, entry, known_aliases)
        problems.extend(entry_problems)
        if key is None:
            broken.append(name)
            continue
        if key.digest in owners:
            problems.append(f"keys.{name}.sha256: the same key as keys.{owners[key.digest]}")
            broken.append(name)
            continue
        owners[key.digest] = name
        keys.append(key)
    if problems:
        raise KeysFileError(source, problems, broken)
    return KeyRing(keys)


def read_keys_file(path: str | Path) -> str:
    """The text of a keys file, or :class:`KeysFileError` saying why it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise KeysFileError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise KeysFileError(str(path), [f"not UTF-8 text: {exc}"]) from None


def load_keys(path: str | Path, *, known_aliases: Collection[str] | None = None) -> KeyRing:
    return parse_keys(read_keys_file(path), source=str(path), known_aliases=known_aliases)


def bearer_token(authorization: bytes | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header value; None when there is none
    (no header, another scheme, an empty token)."""
    if authorization is None:
        return None
    scheme, _, token = authorization.decode("latin-1").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


# The ring behind a file, reloaded when the file changes.
