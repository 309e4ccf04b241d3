"""Which replica of one provider a request tries first: pure decisions, no I/O.

A provider (one vLLM deployment) may list several replicas of the same served model, each behind
its own ``max_inflight`` gate. A policy turns the replicas' state at decision time into an order
of healthy replica names; the caller takes the first whose gate has a free slot and spills to the
next. Three policies (docs/routing.md says when to choose which):

- ``RoundRobin``: the starting point rotates per call.
- ``LeastLoaded``: the lowest load score first (``load_score``), scraped vLLM signals included.
- ``Affinity``: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam), so a
  conversation keeps landing where its prefix is cached, unless that replica carries more than
  its share.

``session_key`` derives the key ``Affinity`` hashes from a request.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import attrs

__all__ = [
    "Affinity",
    "LeastLoaded",
    "Policy",
    "ReplicaView",
    "RoundRobin",
    "load_score",
    "make_policy",
    "session_key",
]

# Rings kept per Affinity instance: the current replica set plus a few recent ones, so a set
# that flaps back (a replica removed from config and re-added) does not rebuild every time.
_RING_CACHE_SIZE = 4
# epsilon as the short decimal an operator writes (0.1, not 0.1000000000000000055...), so the
# bound ceil((1 + epsilon) * m / n) is exact integer arithmetic and 1.1 * 10 / 11 is 1, not 2.
_EPSILON_MAX_DENOMINATOR = 10_000


@attrs.frozen(slots=True)
class ReplicaView:
    """One replica's state at decision time."""

    name: str
    in_flight: int  # requests the gateway has on it now
    capacity: int  # its max_inflight (>= 1)
    healthy: bool = True  # probes pass; unhealthy replicas leave rotation
    waiting: int | None = None  # vLLM's vllm:num_requests_waiting, scraped (None: unknown)
    kv_cache_usage: float | None = None  # vLLM's vllm:kv_cache_usage_perc, 0..1, scraped
    upstream_load: int | None = None  # vLLM's /load (in-flight HTTP requests, all clients)


# --- the session key -------------------------------------------------------------------------


def session_key(session_header: str | None, body: Mapping[str, Any]) -> str:
    """The affinity key of a request, prefixed by where it came from.

    ``s:`` the ``x-session-id`` header (stripped, if not empty); else ``u:`` the body's ``user``
    (a string, not blank); else ``p:`` a blake2b digest of the conversation's opening: the
    messages up to and including the first ``user`` message. That opening is the same on every
    turn of a conversation (clients resend the whole history), so each turn finds the replica
    holding its prefix in cache. The prefixes keep the sources apart: a header ``abc`` and a user
    ``abc`` are different sessions. Never raises on a JSON-shaped body.
    """
    header = session_header.strip() if session_header is not None else ""
    if header:
        return "s:" + header
    user = body.get("user")
    if isinstance(user, str) and user.strip():
        return "u:" + user.strip()
    opening = [_canonical_message(m) for m in _opening(body.get("messages"))]
    # ensure_ascii: lone surrogates (valid JSON escapes) become escapes, so encode cannot fail.
    text = json.dumps(opening, ensure_ascii=True, separators=(",", ":"))
    return "p:" + hashlib.blake2b(text.encode("ascii"), digest_size=16).hexdigest()


def _opening(messages: object) -> list[object]:
    """The messages up to and including the first ``user`` one (all of them if none is)."""
    if not isinstance(messages, list):
        return []
    for i, message in enumerate(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return messages[: i + 1]
    return messages


def _canonical_message(message: object) -> list[object]:
    """[role, content parts, tool calls], each reduced to strings and None.

    Tool-call ids are left out: a client may regenerate them, while name and arguments are what
    the model saw. An image is its URL (the same on every turn); other parts are their type.
    """
    if not isinstance(message, Mapping):
        return [None, [], []]
    role = message.get("role")
    return [
        role if isinstance(role, str) else None,
        _canonical_content(message.get("content")),
        _canonical_tool_calls(message.get("tool_calls")),
    ]


def _canonical_content(content: object) -> list[object]:
    if isinstance(content, str):
        return [["text", content]]
    if not isinstance(content, list):
        return []
    parts: list[object] = []
    for part in content:
        if isinstance(part, str):
            parts.append(["text", part])
        elif isinstance(part, Mapping):
            kind = part.get("type")
            kind = kind if isinstance(kind, str) else None
            if kind == "text":
                parts.append(["text", _str_or_none(part.get("text"))])
            elif kind == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, Mapping) else image
                parts.append(["image_url", _str_or_none(url)])
            else:
                parts.append([kind, None])
        else:
            parts.append([None, None])
    return parts


def _canonical_tool_calls(tool_calls: object) -> list[object]:
    if not isinstance(tool_calls, list):
        return []
    calls: list[object] = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            calls.append(
                [_str_or_none(function.get("name")), _str_or_none(function.get("arguments"))]
            )
        else:
            calls.append([None, None])
    return calls


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


# --- round robin -----------------------------------------------------------------------------


class RoundRobin:
    """The healthy replicas in the order given, starting one further along on each call."""

    def __init__(self) -> None:
        self._calls = 0

    def order(self, replicas: Sequence[ReplicaView], key: str) -> list[str]:
        healthy = [r.name for r in replicas if r.healthy]
        if not healthy:
            return []
        start = self._calls % len(healthy)
        self._calls += 1
        return healthy[start:] + healthy[:start]


# --- least loaded ----------------------------------------------------------------------------


def load_score(replica: ReplicaView) -> float:
    """``(max(in_flight, upstream_load) + waiting + kv_cache_usage) / capacity``.

    Unknown signals count as 0. ``upstream_load`` replaces ``in_flight`` when larger: other
    clients (or other gateway instances) use the replica too. ``waiting`` is added on top,
    although those requests are already in flight: a queued request counts twice, because it
    means the engine is past its batch size and every new request will queue as well.
    ``kv_cache_usage`` (0..1) is worth at most one request: it separates replicas whose
    counts tie or are one apart, preferring the one further from preempting sequences.
    """
    running = replica.in_flight
    if replica.upstream_load is not None:
        running = max(running, replica.upstream_load)
    waiting = replica.waiting or 0
    kv = replica.kv_cache_usage
    # Clamped, and NaN (Prometheus can expose one) ignored: a bad scrape must neither outweigh
    # the counts nor make scores incomparable.
    kv = min(max(kv, 0.0), 1.0) if kv is not None and not math.isnan(kv) else 0.0
    return (running + waiting + kv) / max(replica.capacity, 1)


class LeastLoaded:
    """The healthy replicas by ``load_score``, lowest first.

    Replicas with equal scores take turns: each run of equal scores (in listed order) is rotated
    one step further on each call, so idle replicas share the traffic instead of the first one
    listed taking all of it, and a group of k equal replicas leads exactly once every k calls.
    """

    def __init__(self) -> None:
        self._calls = 0

    def order(self, replicas: Sequence[ReplicaView], key: str) -> list[str]:
        # By score, then listed order: the index is unique, so names are never compared.
        scored = sorted((load_score(r), i, r.name) for i, r in enumerate(replicas) if r.healthy)
        turn = self._calls
        self._calls += 1
        ordered: list[str] = []
        for _, group in itertools.groupby(scored, key=lambda t: t[0]):
            names = [name for _, _, name in group]
            start = turn % len(names)
            ordered += names[start:] + names[:start]
        return ordered


# --- affinity: consistent hashing with bounded loads -----------------------------------------


def _point(text: str) -> int:
    # surrogatepass: a `user` string may carry a lone surrogate (a legal JSON escape).
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@attrs.frozen
class _Ring:
    points: tuple[int, ...]  # sorted
    owners: tuple[str, ...]  # owners[i] holds points[i]

    @classmethod
    def build(cls, names: frozenset[str], virtual_nodes: int) -> _Ring:
        # (point, name): a collision of two points is settled by name, not by set order.
        nodes = sorted(
            (_point(f"{name}#{i}"), name) for name in names for i in range(virtual_nodes)
        )
        return cls(points=tuple(p for p, _ in nodes), owners=tuple(n for _, n in nodes))

    def walk(self, start: int, wanted: set[str]) -> list[str]:
        """The names in ``wanted`` as first met clockwise from point ``start``."""
        found: list[str] = []
        seen: set[str] = set()
        size = len(self.points)
        first = bisect.bisect_left(self.points, start)
        for step in range(size):
            owner = self.owners[(first + step) % size]
            if owner in wanted and owner not in seen:
                seen.add(owner)
                found.append(owner)
                if len(found) == len(wanted):
                    break
        return found


class Affinity:
    """Consistent hashing with bounded loads over the healthy replicas.

    Each replica owns ``virtual_nodes`` points on a 64-bit ring (blake2b of ``"name#i"``); a key
    goes to its point and walks clockwise, and the replicas in the order met are its candidates.
    Removing a replica moves only the keys it held; adding one takes about 1/n of them.

    Bounded load: with ``total`` the in-flight requests on the healthy replicas and ``n`` their
    number, a replica with ``in_flight >= ceil((1 + epsilon) * (total + 1) / n)`` is full. The
    order is the non-full candidates, then the full ones (both in ring order), so a hot key
    overflows to its next replicas on the ring instead of piling onto one. Some replica is always
    below the bound, so while requests arrive and take the first choice, none goes above
    ``ceil((1 + epsilon) * mean)``.

    The ring covers every listed replica, healthy or not: health flapping skips a replica on the
    walk without rebuilding anything, and its keys come back when it does.
    """

    def __init__(self, epsilon: float = 0.25, virtual_nodes: int = 100) -> None:
        if not math.isfinite(epsilon) or epsilon < 0:
            raise ValueError(f"affinity epsilon must be a finite number >= 0, not {epsilon!r}")
        if virtual_nodes < 1:
            raise ValueError(f"affinity virtual_nodes must be >= 1, not {virtual_nodes!r}")
        self.epsilon = epsilon
        self.virtual_nodes = virtual_nodes
        stretch = 1 + Fraction(epsilon).limit_denominator(_EPSILON_MAX_DENOMINATOR)
        self._stretch = (stretch.numerator, stretch.denominator)
        self._rings: dict[frozenset[str], _Ring] = {}

    def bound(self, total_in_flight: int, healthy: int) -> int:
        """The in-flight count at which a replica is full: ceil((1 + eps) * (total + 1) / n)."""
        num, den = self._stretch
        return -(-(num * (total_in_flight + 1)) // (den * healthy))

    def order(self, replicas: Sequence[ReplicaView], key: str) -> list[str]:
        healthy = {r.name: r for r in replicas if r.healthy}
        if not healthy:
            return []
        ring = self._ring(frozenset(r.name for r in replicas))
        candidates = ring.walk(_point(key), set(healthy))
        limit = self.bound(sum(r.in_flight for r in healthy.values()), len(healthy))
        open_ = [name for name in candidates if healthy[name].in_flight < limit]
        full = [name for name in candidates if healthy[name].in_flight >= limit]
        return open_ + full

    def _ring(self, names: frozenset[str]) -> _Ring:
        ring = self._rings.pop(names, None)
        if ring is None:
            ring = _Ring.build(names, self.virtual_nodes)
            if len(self._rings) >= _RING_CACHE_SIZE:
                del self._rings[next(iter(self._rings))]
        # Reinserted last: the dict's order is least recently used first.
        self._rings[names] = ring
        return ring


# --- choosing one ----------------------------------------------------------------------------

Policy = RoundRobin | LeastLoaded | Affinity

_POLICY_NAMES = ("affinity", "least_loaded", "round_robin")


def make_policy(name: str, *, epsilon: float = 0.25) -> Policy:
    """A fresh policy by its config name; ``epsilon`` is used by ``affinity`` only."""
    if name == "round_robin":
        return RoundRobin()
    if name == "least_loaded":
        return LeastLoaded()
    if name == "affinity":
        return Affinity(epsilon=epsilon)
    raise ValueError(f"unknown replica policy {name!r}; choose one of {', '.join(_POLICY_NAMES)}")
