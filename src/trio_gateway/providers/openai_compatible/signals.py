"""What a vLLM replica says about its own load, read from its ``/metrics`` text: pure parsing.

Only the few series the gateway routes and reports on are kept (requests running and waiting,
KV-cache usage, the prefix cache's queries and hits, in tokens); each is summed over its label
sets (one per engine). A line is looked at only if it starts with one of those names, so the
rest of vLLM's exposition (dozens of histograms) costs a ``startswith`` per line.
"""

from __future__ import annotations

import math

import attrs

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
_NAMES = (RUNNING, WAITING, KV_CACHE_USAGE, PREFIX_QUERIES, PREFIX_HITS)
_PREFIXES = tuple(name + c for name in _NAMES for c in ("{", " "))


@attrs.frozen(kw_only=True)
class ReplicaSignals:
    """None: the replica did not say (an older vLLM, another server, not scraped yet)."""

    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None  # 0..1, the mean over engines
    prefix_cache_queries: float | None = None  # tokens looked up in the prefix cache
    prefix_cache_hits: float | None = None  # of which found
    load: int | None = None  # /load: requests held, from every client
    # The gateway's own requests on the server when /load was read: ``load`` minus these is
    # the other clients' share, which stays meaningful after the gateway's own have moved on.
    load_own: int = 0

    def others_load(self) -> int | None:
        """Requests the server holds for other clients (other gateways included)."""
        return None if self.load is None else max(0, self.load - self.load_own)


def parse_vllm_metrics(text: str) -> ReplicaSignals:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith(_PREFIXES):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if not math.isfinite(value) or value < 0:
            continue
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1

    def count(name: str) -> int | None:
        return int(sums[name]) if name in sums else None

    usage = sums[KV_CACHE_USAGE] / counts[KV_CACHE_USAGE] if KV_CACHE_USAGE in sums else None
    return ReplicaSignals(
        running=count(RUNNING),
        waiting=count(WAITING),
        kv_cache_usage=None if usage is None else min(usage, 1.0),
        prefix_cache_queries=sums.get(PREFIX_QUERIES),
        prefix_cache_hits=sums.get(PREFIX_HITS),
    )


@attrs.define
class PrefixCacheRate:
    """The prefix cache's queries and hits (tokens) since the gateway first read a replica's
    counters: what its traffic found in cache while this gateway watched. A counter that goes
    back means the replica restarted from zero: all it counted since is new."""

    queries: float = 0.0
    hits: float = 0.0
    _last: tuple[float, float] | None = None

    def update(self, signals: ReplicaSignals) -> None:
        q, h = signals.prefix_cache_queries, signals.prefix_cache_hits
        if q is None or h is None:
            return
        if self._last is not None:
            last_q, last_h = self._last
            restarted = q < last_q or h < last_h
            self.queries += q if restarted else q - last_q
            self.hits += h if restarted else h - last_h
        self._last = (q, h)

    @property
    def ratio(self) -> float | None:
        return min(1.0, self.hits / self.queries) if self.queries > 0 else None
