"""The shared gate's leases as Prometheus metrics, read from the broker at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from trio_gateway.capacity.gate import LeaseBroker


class LeaseCollector(Collector):
    """max_inflight leased in Redis (gate.py): the broker keeps plain counts, read here."""

    def __init__(self, broker: LeaseBroker) -> None:
        self._broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self._broker
        yield CounterMetricFamily(
            "gateway_lease_redis_calls",
            "Redis round trips for max_inflight leases (acquire, release, renew)",
            value=broker.round_trips,
        )
        yield CounterMetricFamily(
            "gateway_lease_redis_errors",
            "Lease calls to Redis that failed or missed [redis] timeout_s",
            value=broker.errors,
        )
        yield CounterMetricFamily(
            "gateway_lease_lost",
            "Leases found expired at renewal (this process stalled past lease_ttl_s)",
            value=broker.lost_leases,
        )
        yield GaugeMetricFamily(
            "gateway_lease_fallback",
            "1 while Redis fails and [redis] on_lease_error applies",
            value=int(broker.fallback_active()),
        )
        yield GaugeMetricFamily(
            "gateway_lease_peers",
            "Gateway processes holding or renewing leases on this Redis, as last seen",
            value=broker.peers,
        )
        cluster = GaugeMetricFamily(
            "gateway_lease_cluster_in_flight",
            "Leases held by every gateway process, per gate (provider or provider@replica)",
            labels=["gate"],
        )
        for gate in broker.gates():
            if gate.cluster_in_flight is not None:
                cluster.add_metric([gate.key], gate.cluster_in_flight)
        yield cluster
