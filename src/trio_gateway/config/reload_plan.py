"""What a config reload may change, decided before anything changes (pure).

A reload (SIGHUP, ``trio-gateway reload``) applies a new ``gateway.toml`` to a running gateway:
its aliases (their providers, weights, limits, queue policies) and its keys file. Everything
else is bound to things the process set up once (the listening socket, the embedded
simulators, the Redis client, the usage ledger, the WebSocket front's limits): a file that
changes those is refused whole, each change named by its path, and the running config stays.

A provider that keeps its name is one of three cases (:func:`provider_change`):

- **same**: the running provider (its gate, connections, health, probe) is kept;
- **resized**: only ``weight``, ``max_inflight``, ``queue_timeout_s``, ``max_dials_in_flight``
  or the reserved slots changed: the running
  provider is kept and its gate resized, so the requests it holds still count against it;
- **replaced**: anything else (endpoint, model, credentials, timeouts...): a new provider takes
  new requests, and the old one finishes the streams it has before its connections close.
"""

from __future__ import annotations

import enum

import attrs

from trio_gateway.config.schema import GatewayConfig, ProviderConfig

# Fields a running provider can take without being rebuilt.
RESIZABLE_FIELDS = (
    "weight",
    "max_inflight",
    "queue_timeout_s",
    "max_dials_in_flight",
    "reserved_slots",
    "reserved_for_priority_at_most",
)
# Top-level sections bound to what the process set up at start.
FIXED_SECTIONS = (
    "server",
    "websocket",
    "simulators",
    "usage",
    "redis",
    "limits",
    "responses",
    "tracing",
)


class Change(enum.Enum):
    SAME = "same"
    RESIZED = "resized"
    REPLACED = "replaced"


def provider_change(old: ProviderConfig, new: ProviderConfig) -> Change:
    if old == new:
        return Change.SAME
    resized = attrs.evolve(old, **{f: getattr(new, f) for f in RESIZABLE_FIELDS})
    return Change.RESIZED if resized == new else Change.REPLACED


@attrs.frozen
class ReloadPlan:
    """Which running providers a new config keeps, resizes, replaces, adds and retires."""

    same: tuple[str, ...]
    resized: tuple[str, ...]
    replaced: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]

    def summary(self) -> str:
        parts = [
            f"{len(names)} {label}" + (f" ({', '.join(names)})" if names else "")
            for label, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("replaced", self.replaced),
                ("resized", self.resized),
            )
        ]
        return f"{', '.join(parts)}, {len(self.same)} unchanged"


def plan_reload(old: dict[str, ProviderConfig], new: dict[str, ProviderConfig]) -> ReloadPlan:
    changes = {name: provider_change(old[name], new[name]) for name in new if name in old}
    return ReloadPlan(
        same=tuple(n for n, c in changes.items() if c is Change.SAME),
        resized=tuple(n for n, c in changes.items() if c is Change.RESIZED),
        replaced=tuple(n for n, c in changes.items() if c is Change.REPLACED),
        added=tuple(n for n in new if n not in old),
        removed=tuple(n for n in old if n not in new),
    )


def fixed_changes(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """Every change a reload cannot apply, by its path in the file; empty when it can."""
    problems: list[str] = []
    for section in FIXED_SECTIONS:
        before, after = getattr(old, section), getattr(new, section)
        if before == after:
            continue
        problems.extend(
            f"{path}: changed{_values(path, b, a)}; a restart applies it"
            for path, b, a in _differences(section, before, after)
        )
    if old.auth.open != new.auth.open or (old.auth.keys_file is None) != (
        new.auth.keys_file is None
    ):
        # The fronts were built for one or the other; a keys file's path (or content) may change.
        problems.append(
            "auth: changed between keys and open; a restart applies it (a keys file's "
            "content and path reload)"
        )
    return problems


def _differences(path: str, before: object, after: object) -> list[tuple[str, object, object]]:
    """The leaf paths where two values differ (attrs classes and dicts are walked)."""
    if before == after:
        return []
    kind = type(before)
    if attrs.has(kind) and kind is type(after):
        out: list[tuple[str, object, object]] = []
        for field in attrs.fields(kind):
            out += _differences(
                f"{path}.{field.name}", getattr(before, field.name), getattr(after, field.name)
            )
        return out
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after), key=str):
            out += _differences(f"{path}.{key}", before.get(key), after.get(key))
        return out
    return [(path, before, after)]


def _values(path: str, before: object, after: object) -> str:
    # A Redis URL may hold a password: the log names the change, not the values.
    if path.startswith("redis"):
        return ""
    return f" ({_show(before)} -> {_show(after)})"


def _show(value: object) -> str:
    if value is None:
        return "unset"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
