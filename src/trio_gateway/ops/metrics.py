"""Prometheus metrics, in a private registry.

Label sets are kept small on purpose (prometheus-client renders synchronously, and its cost grows
with the number of series): alias, provider, outcome and a stable error code; never request ids,
users or messages. Live gauges (in-flight, queued, probe state) are read at scrape time from the
gates and health objects themselves, so they can never drift from the truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

import attrs
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from trio_gateway.core.descriptors import TALLY as DESCRIPTORS
from trio_gateway.ops.log_queue import DROPPED

if TYPE_CHECKING:
    from trio_gateway.core.events import Usage

M = TypeVar("M", bound=MetricWrapperBase)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# gateway_requests_by_priority's classes: 0 to 9 as themselves, the rest of the 32-bit range
# clamped to two labels, so a client's x-priority cannot grow the series without bound.
PRIORITY_LABELS_MAX = 10


def priority_label(priority: int) -> str:
    if priority < 0:
        return "<0"
    if priority >= PRIORITY_LABELS_MAX:
        return f"{PRIORITY_LABELS_MAX}+"
    return str(priority)


@attrs.frozen(kw_only=True)
class ReplicaGauges:
    """One endpoint of a provider (its only one, or one of its replicas): what it holds and
    what it says of itself (scraped)."""

    replica: str  # host:port
    in_flight: int = 0
    max_inflight: int = 0
    state: str = ""  # for replicas of a replicated provider; "" for a provider's only endpoint
    upstream_load: int | None = None
    waiting: int | None = None  # vLLM's own queue
    kv_cache_usage: float | None = None
    prefix_cache_queries: float = 0.0  # tokens, since the gateway started reading
    prefix_cache_hits: float = 0.0
    prefix_cache_hit_ratio: float | None = None


@attrs.frozen(kw_only=True)
class ProviderGauges:
    provider: str
    in_flight: int
    queued: int
    max_inflight: int
    state: str  # starting | unreachable | healthy | unhealthy
    cooling_down: bool
    upstream_load: int | None
    # Why its last probe or request failed (None after a success): what the status page shows
    # next to a provider that is not healthy.
    last_error: str | None = None
    # Its endpoints: one, or its replicas (each with its gate and state).
    endpoints: tuple[ReplicaGauges, ...] = ()


PROBE_STATES = ("starting", "unreachable", "healthy", "unhealthy")


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
        endpoint_families = _EndpointFamilies()
        for gauges in self._read():
            if gauges.upstream_load is not None:
                load.add_metric([gauges.provider], gauges.upstream_load)
            in_flight.add_metric([gauges.provider], gauges.in_flight)
            queued.add_metric([gauges.provider], gauges.queued)
            capacity.add_metric([gauges.provider], gauges.max_inflight)
            for name in PROBE_STATES:
                state.add_metric([gauges.provider, name], 1.0 if gauges.state == name else 0.0)
            cooling.add_metric([gauges.provider], 1.0 if gauges.cooling_down else 0.0)
            for endpoint in gauges.endpoints:
                endpoint_families.add(gauges.provider, endpoint)
        yield from (in_flight, queued, capacity, state, cooling, load)
        yield from endpoint_families.all()


class _EndpointFamilies:
    """Per endpoint (a provider's only one, or each replica): the gate and state of replicas,
    and what vLLM says of itself, scraped."""

    def __init__(self) -> None:
        labels = ["provider", "replica"]
        self.in_flight = GaugeMetricFamily(
            "gateway_replica_in_flight", "Requests holding a replica's slot", labels=labels
        )
        self.capacity = GaugeMetricFamily(
            "gateway_replica_max_inflight", "A replica's slot count", labels=labels
        )
        self.state = GaugeMetricFamily(
            "gateway_replica_state",
            "1 for the replica's current probe state",
            labels=[*labels, "state"],
        )
        self.load = GaugeMetricFamily(
            "gateway_replica_upstream_load",
            "Requests the replica reports holding (vLLM /load), from every client",
            labels=labels,
        )
        self.waiting = GaugeMetricFamily(
            "gateway_upstream_requests_waiting",
            "Requests waiting in the server's own queue (vLLM num_requests_waiting), scraped",
            labels=labels,
        )
        self.kv_cache = GaugeMetricFamily(
            "gateway_upstream_kv_cache_usage",
            "The server's KV-cache usage, 0 to 1 (vLLM kv_cache_usage_perc), scraped",
            labels=labels,
        )
        self.queries = CounterMetricFamily(
            "gateway_prefix_cache_queries_tokens",
            "Prompt tokens the server looked up in its prefix cache since the gateway started",
            labels=labels,
        )
        self.hits = CounterMetricFamily(
            "gateway_prefix_cache_hits_tokens",
            "Of those, the tokens found in the prefix cache",
            labels=labels,
        )
        self.ratio = GaugeMetricFamily(
            "gateway_prefix_cache_hit_ratio",
            "Prefix-cache hits over queries (tokens) since the gateway started",
            labels=labels,
        )

    def add(self, provider: str, endpoint: ReplicaGauges) -> None:
        key = [provider, endpoint.replica]
        if endpoint.state:
            self.in_flight.add_metric(key, endpoint.in_flight)
            self.capacity.add_metric(key, endpoint.max_inflight)
            for name in PROBE_STATES:
                self.state.add_metric([*key, name], 1.0 if endpoint.state == name else 0.0)
            if endpoint.upstream_load is not None:
                self.load.add_metric(key, endpoint.upstream_load)
        if endpoint.waiting is not None:
            self.waiting.add_metric(key, endpoint.waiting)
        if endpoint.kv_cache_usage is not None:
            self.kv_cache.add_metric(key, endpoint.kv_cache_usage)
        if endpoint.prefix_cache_hit_ratio is not None:
            self.queries.add_metric(key, endpoint.prefix_cache_queries)
            self.hits.add_metric(key, endpoint.prefix_cache_hits)
            self.ratio.add_metric(key, endpoint.prefix_cache_hit_ratio)

    def all(self) -> tuple[Metric, ...]:
        return (
            self.in_flight,
            self.capacity,
            self.state,
            self.load,
            self.waiting,
            self.kv_cache,
            self.queries,
            self.hits,
            self.ratio,
        )


class ToolCallStopCollector(Collector):
    """``gateway_tool_call_early_stops_total{provider}``: answers the gateway ended at their
    first complete tool call (``parallel_tool_calls: false`` on an ``openai_compatible``
    provider, toolcall_stop.py). The providers keep the counts; they are read at scrape time."""

    def __init__(self, read: Callable[[], Iterable[tuple[str, int]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        stops = CounterMetricFamily(
            "gateway_tool_call_early_stops",
            "Answers ended at their first complete tool call (parallel_tool_calls: false)",
            labels=["provider"],
        )
        for provider, count in self._read():
            stops.add_metric([provider], count)
        yield stops


class LogDropCollector(Collector):
    """``gateway_log_records_dropped_total{level}``: log records the process did not write, its
    log's queue full behind a reader that did not keep up, or stderr closed (log_queue.py).
    Logging is the process's, so these are too: every gateway in one process reports the same
    counts."""

    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            "gateway_log_records_dropped",
            "Log records not written: the log's queue was full (its reader too slow or stuck),"
            " or stderr refused them",
            labels=["level"],
        )
        for level, records in self._read().items():
            dropped.add_metric([level], records)
        yield dropped


class DescriptorCollector(Collector):
    """``gateway_descriptors_exhausted_total{where}``: times the process was out of file
    descriptors when accepting a client (``accept``) or dialling an upstream (``dial``), each
    answered 503 ``overloaded`` (core/descriptors.py). The process's, as the limit is."""

    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        exhausted = CounterMetricFamily(
            "gateway_descriptors_exhausted",
            "Times the process was out of file descriptors (EMFILE/ENFILE), by where",
            labels=["where"],
        )
        for where, times in self._read().items():
            exhausted.add_metric([where], times)
        yield exhausted


class TraceExportCollector(Collector):
    """``[tracing]``'s export (ops/otel.py): ``gateway_trace_spans_exported_total``,
    ``gateway_trace_spans_dropped_total{reason}`` (``queue_full``: the exporter was behind, a
    collector down or slow; ``export_failed``: in a batch the collector did not take) and
    ``gateway_trace_spans_queued``. Read from the exporter's counts at scrape time."""

    def __init__(self, read: Callable[[], tuple[int, Mapping[str, int], int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        exported, dropped, queued = self._read()
        yield CounterMetricFamily(
            "gateway_trace_spans_exported", "Spans the collector took", value=exported
        )
        family = CounterMetricFamily(
            "gateway_trace_spans_dropped",
            "Spans not exported, by reason (queue_full, export_failed)",
            labels=["reason"],
        )
        for reason, spans in dropped.items():
            family.add_metric([reason], spans)
        yield family
        yield GaugeMetricFamily(
            "gateway_trace_spans_queued", "Ended spans waiting for the exporter", value=queued
        )


class Children(Generic[M]):
    """A labelled metric's children, by their label values. prometheus-client's ``labels()``
    takes a lock and rebuilds its key on every call, and a request made five such calls; a
    dict lookup finds the same child (the one ``labels()`` made and the registry holds, so
    this holds no series the registry does not)."""

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class Metrics:
    def __init__(self, read_providers: Callable[[], Iterable[ProviderGauges]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        registry = self.registry
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds...: per
        # process (a worker of [server] workers reports its own), read from /proc at scrape.
        ProcessCollector(registry=registry)
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
        self.priority_requests = Counter(
            "gateway_requests_by_priority",
            "Requests by alias, priority class (0 to 9; <0 and 10+ clamped) and outcome",
            ["alias", "priority", "outcome"],
            registry=registry,
        )
        self.filter_matches = Counter(
            "gateway_filter_matches",
            "Filter matches by alias, filter and action: mask, block (an answer's), refuse (a"
            " request's input)",
            ["alias", "filter", "action"],
            registry=registry,
        )
        self.config_reloads = Counter(
            "gateway_config_reloads",
            "Config reloads (SIGHUP, trio-gateway reload), by result (applied, rejected)",
            ["result"],
            registry=registry,
        )
        for result in ("applied", "rejected"):
            self.config_reloads.labels(result)
        # The agent fronts (/v1/responses, /v1/messages): what of a request they did not use.
        self.front_dropped_fields = Counter(
            "gateway_front_dropped_fields",
            "Request fields (and built-in tools, 'tool:<type>') a front dropped, by front and "
            "field ('other' for a field it does not know)",
            ["front", "field"],
            registry=registry,
        )
        # The Responses API's WebSocket mode (/v1/responses): its sockets and their creates.
        self.responses_sockets = Counter(
            "gateway_responses_sockets_opened",
            "WebSockets accepted on /v1/responses (the Responses API's WebSocket mode)",
            registry=registry,
        )
        self.responses_socket_creates = Counter(
            "gateway_responses_socket_creates",
            "response.create messages on /v1/responses WebSockets, by outcome: answered (sent"
            " to a provider), remembered (generate: false), refused (before a provider)",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("answered", "remembered", "refused"):
            self.responses_socket_creates.labels(outcome)
        registry.register(_LiveCollector(read_providers))
        registry.register(LogDropCollector(DROPPED.by_level))
        registry.register(DescriptorCollector(DESCRIPTORS.by_place))
        # The series every request touches, looked up without labels() (see Children).
        self._requests = Children(self.requests)
        self._priority_requests = Children(self.priority_requests)
        self._http_requests = Children(self.http_requests)
        self._cancellations = Children(self.cancellations)
        self._ttft = Children(self.ttft)
        self._duration = Children(self.duration)
        self._tokens = Children(self.tokens)

    def http_request(self, route: str, status: str) -> None:
        self._http_requests.labels(route, status).inc()

    def front_dropped(self, front: str, field: str) -> None:
        self.front_dropped_fields.labels(front, field).inc()

    def request(self, alias: str, provider: str, outcome: str, code: str) -> None:
        self._requests.labels(alias, provider, outcome, code).inc()

    def request_priority(self, alias: str, priority: int, outcome: str) -> None:
        self._priority_requests.labels(alias, priority_label(priority), outcome).inc()

    def request_ended(
        self,
        alias: str,
        provider: str,
        *,
        cancelled: str | None,
        ttft_s: float | None,
        duration_s: float,
        usage: Usage | None,
    ) -> None:
        """A relayed request's series other than its count (:meth:`request`)."""
        if cancelled is not None:
            self._cancellations.labels(cancelled).inc()
        if ttft_s is not None:
            self._ttft.labels(alias, provider).observe(ttft_s)
        self._duration.labels(alias, provider).observe(duration_s)
        if usage is not None:
            tokens = self._tokens
            tokens.labels(alias, provider, "prompt").inc(usage.prompt_tokens)
            tokens.labels(alias, provider, "completion").inc(usage.completion_tokens)
            if usage.reasoning_tokens:
                tokens.labels(alias, provider, "reasoning").inc(usage.reasoning_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
