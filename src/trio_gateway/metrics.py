"""Prometheus metrics, in a private registry.

Label sets are kept small on purpose (prometheus-client renders synchronously, and its cost grows
with the number of series): alias, provider, outcome and a stable error code; never request ids,
users or messages. Live gauges (in-flight, queued, probe state) are read at scrape time from the
gates and health objects themselves, so they can never drift from the truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@attrs.frozen(kw_only=True)
class ProviderGauges:
    provider: str
    in_flight: int
    queued: int
    max_inflight: int
    state: str  # starting | healthy | unhealthy
    cooling_down: bool
    upstream_load: int | None


PROBE_STATES = ("starting", "healthy", "unhealthy")


class _LiveCollector(Collector):
    def __init__(self, read: Callable[[], Iterable[ProviderGauges]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "gateway_provider_in_flight", "Requests holding a provider slot", labels=["provider"]
        )
        queued = GaugeMetricFamily(
            "gateway_provider_queued", "Requests waiting for a provider slot", labels=["provider"]
        )
        capacity = GaugeMetricFamily(
            "gateway_provider_max_inflight", "A provider's slot count", labels=["provider"]
        )
        state = GaugeMetricFamily(
            "gateway_provider_state",
            "1 for the provider's current probe state",
            labels=["provider", "state"],
        )
        cooling = GaugeMetricFamily(
            "gateway_provider_cooling_down",
            "1 while a provider waits out a Retry-After",
            labels=["provider"],
        )
        load = GaugeMetricFamily(
            "gateway_provider_upstream_load",
            "Requests the provider reports holding (vLLM /load), from every client",
            labels=["provider"],
        )
        for gauges in self._read():
            if gauges.upstream_load is not None:
                load.add_metric([gauges.provider], gauges.upstream_load)
            in_flight.add_metric([gauges.provider], gauges.in_flight)
            queued.add_metric([gauges.provider], gauges.queued)
            capacity.add_metric([gauges.provider], gauges.max_inflight)
            for name in PROBE_STATES:
                state.add_metric([gauges.provider, name], 1.0 if gauges.state == name else 0.0)
            cooling.add_metric([gauges.provider], 1.0 if gauges.cooling_down else 0.0)
        yield from (in_flight, queued, capacity, state, cooling, load)


class Metrics:
    def __init__(self, read_providers: Callable[[], Iterable[ProviderGauges]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        registry = self.registry
        self.requests = Counter(
            "gateway_requests",
            "Requests by alias, the provider that answered, outcome and error code",
            ["alias", "provider", "outcome", "code"],
            registry=registry,
        )
        self.http_requests = Counter(
            "gateway_http_requests",
            "Every HTTP request, by route (a known route, or 'other') and status",
            ["route", "status"],
            registry=registry,
        )
        self.spills = Counter(
            "gateway_spills",
            "Requests moved to another provider because one was saturated",
            ["alias", "from_provider", "to_provider"],
            registry=registry,
        )
        self.failovers = Counter(
            "gateway_failovers",
            "Attempts moved to another provider because one failed",
            ["alias", "from_provider", "to_provider"],
            registry=registry,
        )
        self.refusals = Counter(
            "gateway_refusals",
            "Requests refused before anything was sent upstream",
            ["alias", "reason"],
            registry=registry,
        )
        self.cancellations = Counter(
            "gateway_cancellations",
            "Requests cancelled, by cause (client_gone, client_stall, ws_cancel, shutdown)",
            ["cause"],
            registry=registry,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "From the request's arrival to the first event from the provider",
            ["alias", "provider"],
            buckets=TTFT_BUCKETS_S,
            registry=registry,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "From the request's arrival to its end",
            ["alias", "provider"],
            buckets=DURATION_BUCKETS_S,
            registry=registry,
        )
        self.tokens = Counter(
            "gateway_tokens",
            "Tokens by alias, provider and kind (prompt, completion, reasoning)",
            ["alias", "provider", "kind"],
            registry=registry,
        )
        registry.register(_LiveCollector(read_providers))

    def render(self) -> bytes:
        return generate_latest(self.registry)
