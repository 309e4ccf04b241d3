"""A provider with several endpoints of one served model: replicas, and which one a request tries.

Each replica is an ``Upstream`` of its own (gate of ``max_inflight``, connection pool, health,
probe, scraped signals); the provider's capacity is their sum, and the alias's spill and queue
policies see the provider as a whole. The order in which a request tries the replicas is the
provider's ``routing`` policy (``replica_policy.py``, pure) over their state at that moment;
replicas out of rotation (failing probes, cooling down) come last, tried only when nothing else
is left, as providers are at the alias level.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import attrs

from trio_gateway.capacity.gate import GateStats
from trio_gateway.capacity.health import HealthSnapshot, ProviderHealth, State
from trio_gateway.capacity.replica_policy import Affinity, ReplicaView, make_policy, session_key
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.request import ChatRequest
from trio_gateway.providers.upstream import Upstream


def replica_label(url: str) -> str:
    """A replica's name in metrics and logs: its host and port."""
    parts = urlsplit(url)
    return parts.netloc or url


def replica_config(provider: ProviderConfig, url: str) -> ProviderConfig:
    """One replica's own config: the provider's, with its endpoint."""
    return attrs.evolve(provider, base_url=url, endpoints=())


@attrs.define(eq=False)
class Replica:
    name: str  # host:port
    upstream: Upstream
    health: ProviderHealth

    def view(self, now: float) -> ReplicaView:
        stats = self.upstream.gate.statistics()
        signals = self.upstream.signals
        # A scraped /load is seconds old: the gateway's own requests in it may have ended since.
        # What counts is the others' share, on top of the gateway's count now.
        others = signals.others_load()
        load = None if others is None else stats.in_flight + others
        return ReplicaView(
            name=self.name,
            in_flight=stats.in_flight,
            capacity=stats.max_inflight,
            healthy=self.health.in_rotation(now),
            waiting=signals.waiting,
            kv_cache_usage=signals.kv_cache_usage,
            upstream_load=load,
        )


class GroupHealth:
    """A replicated provider's health as the alias sees it: in rotation while any replica is."""

    def __init__(self, members: Sequence[ProviderHealth]) -> None:
        self._members = tuple(members)

    @property
    def state(self) -> State:
        states = {m.state for m in self._members}
        for state in (State.HEALTHY, State.STARTING, State.UNREACHABLE):
            if state in states:
                return state
        return State.UNHEALTHY

    @property
    def last_error(self) -> str | None:
        return next((m.last_error for m in self._members if m.last_error), None)

    @property
    def upstream_load(self) -> int | None:
        loads = [m.upstream_load for m in self._members if m.upstream_load is not None]
        return sum(loads) if loads else None

    def in_rotation(self, now: float) -> bool:
        return any(m.in_rotation(now) for m in self._members)

    def cooling_down(self, now: float) -> bool:
        return all(m.cooling_down(now) for m in self._members)

    def snapshot(self, now: float) -> HealthSnapshot:
        snaps = [m.snapshot(now) for m in self._members]
        return HealthSnapshot(
            state=self.state,
            consecutive_failures=min(s.consecutive_failures for s in snaps),
            consecutive_successes=max(s.consecutive_successes for s in snaps),
            cooling_down=self.cooling_down(now),
            last_error=self.last_error,
            upstream_load=self.upstream_load,
        )


class ReplicaSet:
    """One provider, several replicas. Duck-types what the router reads of an ``Upstream``
    (``name``, ``config``, ``statistics()``); requests go to a ``Replica``'s upstream."""

    def __init__(self, config: ProviderConfig, replicas: Sequence[Replica]) -> None:
        self.config = config
        self.name = config.name
        self.replicas = tuple(replicas)
        self.health = GroupHealth([r.health for r in self.replicas])
        self.policy = make_policy(config.routing, epsilon=config.affinity_epsilon)
        self._by_name = {r.name: r for r in self.replicas}

    def statistics(self) -> GateStats:
        stats = [r.upstream.statistics() for r in self.replicas]
        return GateStats(
            in_flight=sum(s.in_flight for s in stats),
            waiting=sum(s.waiting for s in stats),
            max_inflight=sum(s.max_inflight for s in stats),
        )

    def candidates(self, request: ChatRequest, now: float) -> list[Replica]:
        """The replicas in the order ``request`` should try them."""
        views = [r.view(now) for r in self.replicas]
        key = (
            session_key(request.session_id, request.body)
            if isinstance(self.policy, Affinity)
            else ""
        )
        chosen = [self._by_name[name] for name in self.policy.order(views, key)]
        # Out of rotation: a last resort, in their configured order.
        return chosen + [r for r in self.replicas if r not in chosen]
