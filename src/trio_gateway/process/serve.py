"""Serving: embedded simulators, one httpx pool per provider, hypercorn on the trio worker."""

from __future__ import annotations

import gc
import logging
import random
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from functools import partial

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets

from trio_gateway.accounting.admission import open_limits
from trio_gateway.accounting.host_store import host_limits
from trio_gateway.accounting.ledger import LEDGER_MEMORY, QueuedSink, SQLiteLedger, ledger_path
from trio_gateway.accounting.response_sqlite import SQLiteResponseStore
from trio_gateway.accounting.response_store import open_response_store
from trio_gateway.accounting.sinks import open_usage_sink
from trio_gateway.accounting.spend import LedgerSpend, open_spend
from trio_gateway.capacity.gate import LeaseBroker
from trio_gateway.capacity.host_gate import HostGates
from trio_gateway.capacity.host_link import HostLink
from trio_gateway.capacity.lease_metrics import LeaseCollector
from trio_gateway.config.load import parse_hostport
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.core.budget_period import period_of
from trio_gateway.core.usage import UsageSink
from trio_gateway.dispatch.live import Gates, Running, open_provider, serve_services
from trio_gateway.dispatch.router import Provider, Router
from trio_gateway.fronts.app import OWN_WEBSOCKET_PATHS, GatewayApp
from trio_gateway.fronts.http import MAX_BODY_BYTES_KEY
from trio_gateway.fronts.responses.seal import Sealer
from trio_gateway.fronts.responses.service import ResponsesService, attach_responses
from trio_gateway.http1.listen import Connections, serve_asgi
from trio_gateway.ops.metrics import ToolCallStopCollector, TraceExportCollector
from trio_gateway.ops.spans import Tracing
from trio_gateway.process.reloader import LoadConfig, Reloader
from trio_gateway.providers.openai_compatible.replicas import ReplicaSet
from trio_gateway.redis.client import RedisClient, open_redis
from trio_gateway.redis.url import parse_redis_url
from trio_gateway.sim import SimHandle, serve_sim

log = logging.getLogger("trio_gateway")

# The gateway's own stall deadline acts first (it frees the upstream); the kernel's drop of the
# socket follows shortly after.
STALL_DROP_MARGIN_S = 1.0
LISTEN_BACKLOG = 2048  # uvicorn's default
# After the drain deadline cancels the answers still running, the time they get to send their
# last error event before hypercorn closes the connections.
DRAIN_MARGIN_S = 2.0
# Passes of the middle generation before a full collection may run (CPython's default: 10).
FULL_COLLECTION_EVERY = 100


class ListenError(OSError):
    """An address the config names cannot be listened on: says which address, and which key of
    the config wants it (the embedded simulator's port is a common surprise)."""


def listen_origin(config: GatewayConfig) -> str:
    """Where ``server.listen`` came from, as a message names it."""
    if config.listen_origin == "server.listen":
        return "server.listen in the config"
    return f"given by {config.listen_origin}"


@contextmanager
def listening_on(listen: str, origin: str) -> Iterator[None]:
    """``origin``: where the address came from (``server.listen in the config``, ``--listen``)."""
    try:
        yield
    except* OSError as group:
        # A bind fails inside the simulator's own nursery too, so it may come wrapped.
        exc = group.exceptions[0]
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        raise ListenError(f"cannot listen on {listen} ({origin}): {reason}") from exc


@attrs.frozen
class GatewayHandle:
    base_url: str  # "http://HOST:PORT", no /v1
    router: Router
    app: GatewayApp
    simulators: dict[str, SimHandle]
    reloader: Reloader

    async def reload(self) -> bool:
        """Re-read the config file and apply it (reloader.py); False when it was refused."""
        return await self.reloader.reload()


def hypercorn_config(
    listen: str, *, graceful_timeout_s: float, websocket_max_message_bytes: int
) -> HypercornConfig:
    config = HypercornConfig()
    # Twice the gateway's own limit: a message somewhat too large still gets a clear refusal
    # event from the WebSocket front; a far larger one is cut off by hypercorn (close 1009)
    # before it is buffered whole.
    config.websocket_max_message_size = 2 * websocket_max_message_bytes
    config.bind = [listen]
    config.accesslog = None
    # Through logging, like the rest of the gateway, not a second stream of its own.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = graceful_timeout_s
    # Long generations: the connection stays open between chunks.
    config.keep_alive_timeout = 75
    # hypercorn's default of 100 refused connections when thousands of clients arrived at once
    # (docs/benchmarks.md, scenario D); the kernel caps it at net.core.somaxconn.
    config.backlog = LISTEN_BACKLOG
    return config


def listening_sockets(
    config: HypercornConfig, *, stall_timeout_s: float, kernel_stall_drop: bool = True
) -> Sockets:
    """hypercorn writes to a client shielded and without a timeout, so a client that stops
    reading would hold its handler forever. The gateway's stall deadline drops such a
    connection itself (``listen.Connections``); TCP_USER_TIMEOUT (inherited by accepted sockets),
    where the platform has it, is a second line: the kernel drops a connection whose data stays
    unacknowledged, or stuck behind a zero window, for that long, whatever the handler does."""
    sockets = config.create_sockets()
    timeout_ms = int((stall_timeout_s + STALL_DROP_MARGIN_S) * 1000)
    for sock in sockets.insecure_sockets:
        if (
            kernel_stall_drop
            and sock.family in (socket.AF_INET, socket.AF_INET6)
            and hasattr(socket, "TCP_USER_TIMEOUT")
        ):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, timeout_ms)
        sock.listen(config.backlog)
    return sockets


@asynccontextmanager
async def _maybe_redis(config: GatewayConfig) -> AsyncIterator[RedisClient | None]:
    if config.redis is None:
        yield None
        return
    redis = config.redis
    async with open_redis(redis.url, ca_file=redis.ca_file, cluster=redis.cluster) as client:
        yield client


async def serve_gateway(
    config: GatewayConfig,
    *,
    rng: random.Random | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    kernel_stall_drop: bool = True,
    load: LoadConfig | None = None,
    inherited: socket.socket | None = None,
    simulators: bool = True,
    host_broker: socket.socket | None = None,
    workers: int = 1,
    task_status: trio.TaskStatus[GatewayHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; or, once ``shutdown_trigger`` returns, stop accepting, let
    running streams finish for up to ``drain_timeout_s``, then cancel what is left.

    ``kernel_stall_drop=False`` leaves TCP_USER_TIMEOUT off, as on a platform without it.
    The usage ledger's service (``ledger.serve_ledger``) outlives every request, so the
    records of the last ones are written too. ``load`` reads the config again for a reload
    (``GatewayHandle.reload``); without it, a reload is refused. A worker (workers.py) serves
    the listening socket its supervisor ``inherited`` it, leaves the embedded ``simulators``
    to the supervisor, and shares its limits with the other workers through the supervisor's
    ``host_broker`` (host_broker.py): the slots without Redis leases, budgets and rate limits
    without Redis. A worker is one of ``workers``: it takes its share of what is split
    (``max_dials_in_flight``)."""
    warn_unused_keys(config)
    async with open_usage_sink(config) as usage:
        await _serve_gateway(
            config,
            usage,
            rng=rng,
            shutdown_trigger=shutdown_trigger,
            kernel_stall_drop=kernel_stall_drop,
            load=load,
            inherited=inherited,
            simulators=simulators,
            host_broker=host_broker,
            workers=workers,
            task_status=task_status,
        )


def freeze_start_up() -> None:
    """Keep the cyclic collector's full passes rare and short.

    What is alive once the gateway serves (modules, config, app, pools: some 80,000 objects)
    lives as long as the process; moved out of the collector's reach (``gc.freeze``), a pass
    walks only what requests made since: in scenario B the longest full pass went from 159 to
    37 ms. A full pass still walks every live object of every open stream (about 160 each): at
    5,000 streams one took 0.8 s, and CPython's default made 21 of them in scenario D's 50 s.
    Streams leave almost no cyclic garbage (4 objects after all 5,000), so a full pass is
    allowed only after 100 passes of the middle generation instead of 10 (and, as always, once
    long-lived objects grew by a quarter): 4 in the same run, TTFT p99 11.2 -> 8.5 s
    (docs/benchmarks.md). The young generations are collected as before.

    The CLI calls this once serving, not ``serve_gateway``: a test process runs many gateways,
    and what is frozen is never collected as a cycle."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


def warn_unused_keys(config: GatewayConfig) -> None:
    """Keys still accepted (an older config stays valid) that no longer do anything: said at
    start (as by `check`), so "accepted" never looks like "applied"."""
    for warning in config.warnings:
        log.warning("%s: %s", config.source, warning)


async def _serve_gateway(
    config: GatewayConfig,
    usage: UsageSink,
    *,
    rng: random.Random | None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    kernel_stall_drop: bool,
    load: LoadConfig | None,
    inherited: socket.socket | None,
    simulators: bool,
    host_broker: socket.socket | None,
    workers: int,
    task_status: trio.TaskStatus[GatewayHandle],
) -> None:
    # The pools must outlive every task that uses them: the exit stack and Redis's client (its
    # own task group, so it cannot be entered into the stack from inside the nursery) enclose
    # the nursery.
    async with (
        AsyncExitStack() as stack,
        _maybe_redis(config) as redis,
        trio.open_nursery() as nursery,
    ):
        sims = await start_simulators(config, nursery) if simulators else {}
        broker = _lease_broker(config, redis)
        if broker is not None:
            await nursery.start(broker.serve)
            assert config.redis is not None
            log.info(
                "limits: max_inflight shared as leases in %s (lease ttl %g s)",
                parse_redis_url(config.redis.url).display(),
                config.redis.lease_ttl_s,
            )
        link = None
        if host_broker is not None:
            link = HostLink(host_broker)
            stack.callback(link.close)
            await nursery.start(link.serve)
        host_gates = HostGates(link) if link is not None and broker is None else None
        if host_gates is not None:
            log.info("limits: max_inflight shared by the host's workers (the supervisor's broker)")
        gates = Gates(broker, host_gates, workers)
        running: dict[str, Running] = {}
        # Whatever runs at the end (a reload swaps providers) closes its connections.
        stack.push_async_callback(_close_all, running)
        for name, provider in config.providers().items():
            running[name] = await open_provider(provider, config.api_keys, gates)
        router = Router(
            config.aliases,
            {name: r.provider for name, r in running.items()},
            rng=rng,
            health={name: r.health for name, r in running.items() if r.health is not None},
            filters=config.filters,
        )
        router.usage = usage
        # One Redis client for the gateway's life; it dials again by itself after any failure.
        if link is not None and config.redis is None:
            router.limits = host_limits(config, link)
            log.info("limits: budgets and rate limits shared by the host's workers")
        else:
            router.limits = open_limits(config, redis)
        if config.redis is not None:
            log.info(
                "limits: budgets and rate limits in %s: spend lives there, shared by the "
                "replicas and kept across restarts (`trio-gateway usage --reconcile` compares "
                "it with the ledger)",
                parse_redis_url(config.redis.url).display(),
            )
        router.metrics.registry.register(router.limits.collector())
        if broker is not None:
            router.metrics.registry.register(LeaseCollector(broker))
        router.metrics.registry.register(
            ToolCallStopCollector(
                lambda: [(name, _early_stops(u)) for name, u in router.upstreams.items()]
            )
        )
        if isinstance(usage, QueuedSink):
            router.metrics.registry.register(usage.collector())
        router.tracing = open_tracing(config, router)
        if router.tracing is not None:
            # After the nursery: the last requests' spans are ended, then exported (bounded).
            stack.push_async_callback(router.tracing.aclose)
        for one in running.values():
            one.services = await nursery.start(serve_services, one)
        connections = Connections()
        app = GatewayApp(config, router, connections)
        await _rebuild_spend(config, router, app, usage, stack)
        responses = open_response_store(config, ledger_path(config), redis)
        if isinstance(responses, SQLiteResponseStore):
            stack.push_async_callback(responses.aclose)
        seal_key = config.seal_key.value.encode() if config.seal_key is not None else None
        attach_responses(router, ResponsesService(responses, Sealer(seal_key), config.responses))
        reloader = Reloader(config, running, router, app, gates, nursery, load)
        drain_s = config.server.drain_timeout_s
        # hypercorn's own deadline comes after ours, so answers end with an error event and a
        # clean end of stream rather than a cut connection.
        hc = hypercorn_config(
            config.server.listen,
            graceful_timeout_s=drain_s + DRAIN_MARGIN_S,
            websocket_max_message_bytes=max(
                config.websocket.max_message_bytes,
                config.websocket.responses.max_message_bytes,
            ),
        )
        stopped = trio.Event()
        stopping = trio.Event()

        async def drain_then_stop() -> None:
            if shutdown_trigger is None:
                await trio.sleep_forever()
            else:
                await shutdown_trigger()
            router.drain.begin()
            stopping.set()
            # The listener stays open while answers finish: /readyz says "draining" (so a load
            # balancer stops sending), /healthz and /metrics answer, and a new chat request gets
            # 503 shutting_down instead of a refused connection. It closes once the last answer
            # has ended, or end_the_drain has cancelled what was left.
            await router.drain.idle()

        async def end_the_drain() -> None:
            await stopping.wait()
            await trio.sleep(drain_s)
            if len(router.drain):
                log.warning("drain over: cancelling %d answers", len(router.drain))
            router.drain.cancel_all()

        nursery.start_soon(end_the_drain)
        if inherited is not None:
            sockets = Sockets(secure_sockets=[], insecure_sockets=[inherited], quic_sockets=[])
        else:
            with listening_on(config.server.listen, listen_origin(config)):
                sockets = listening_sockets(
                    hc,
                    stall_timeout_s=config.server.client_stall_timeout_s,
                    kernel_stall_drop=kernel_stall_drop,
                )

        async def run_app(*, task_status: trio.TaskStatus[list[str]]) -> None:
            try:
                await serve_asgi(
                    app,
                    hc,
                    sockets,
                    connections,
                    shutdown_trigger=drain_then_stop,
                    # A client that takes nothing for this long is not worth a connection; an
                    # answer's own stall deadline acts first (relay, fronts/direct.py).
                    write_timeout_s=config.server.client_stall_timeout_s + STALL_DROP_MARGIN_S,
                    head_timeout_s=config.server.head_timeout_s,
                    body_timeout_s=config.server.body_timeout_s,
                    max_body_bytes=config.server.max_body_bytes,
                    body_limit_name=MAX_BODY_BYTES_KEY,
                    on_refused=app.refused_by_server,
                    websocket_paths=OWN_WEBSOCKET_PATHS,
                    task_status=task_status,
                )
            finally:
                stopped.set()

        binds: list[str] = await nursery.start(run_app)
        log.info("trio-gateway serving on %s", binds[0])
        task_status.started(
            GatewayHandle(
                base_url=binds[0],
                router=router,
                app=app,
                simulators=sims,
                reloader=reloader,
            )
        )
        await stopped.wait()
        nursery.cancel_scope.cancel(reason="gateway stopped")


async def start_simulators(config: GatewayConfig, nursery: trio.Nursery) -> dict[str, SimHandle]:
    """The config's embedded simulators, serving in ``nursery``."""
    simulators: dict[str, SimHandle] = {}
    for name, simulator in config.simulators.items():
        host, port = parse_hostport(simulator.listen)
        with listening_on(simulator.listen, f"simulators.{name}.listen in the config"):
            simulators[name] = await nursery.start(
                partial(serve_sim, simulator.sim, host=host, port=port)
            )
        log.info("simulator %s serving on %s", name, simulators[name].base_url)
    return simulators


async def _rebuild_spend(
    config: GatewayConfig, router: Router, app: GatewayApp, usage: UsageSink, stack: AsyncExitStack
) -> None:
    """Without Redis, each key's spend in its budget's period from the usage ledger (and each
    key's cost today, for the status page), so that budgets hold across a restart."""
    if app.keys is None:
        return  # no keys, no budgets
    ledger = usage.path if isinstance(usage, SQLiteLedger) else None
    why = f"[usage] sink = {config.usage.sink!r}"
    if ledger == LEDGER_MEMORY:
        ledger, why = None, "the usage ledger is in memory"
    elif ledger is None and config.usage.sink == "sqlite":
        why = '[usage] ledger = "none"'
    now = time.time()
    spend = await open_spend(router.limits, ledger, list(app.keys.ring()), why_none=why, now=now)
    if ledger is not None:
        today = period_of("day", now)
        reader = spend if spend is not None else LedgerSpend(ledger)
        try:
            router.today.seed(now, await reader.by_key_since(today.start))
        except sqlite3.Error as exc:
            log.warning("status: today's costs could not be read from %s: %s", ledger, exc)
        if spend is None:
            reader.close()
    if spend is not None:
        stack.callback(spend.close)


def open_tracing(config: GatewayConfig, router: Router) -> Tracing | None:
    """``[tracing]``'s exporter and its metrics, or None without the section. The SDK is the
    ``tracing`` extra, imported here only (config checks made sure it is installed)."""
    settings = config.tracing
    if settings is None:
        return None
    from trio_gateway.ops.otel import OtelTracing

    tracing = OtelTracing(
        otlp_endpoint=settings.otlp_endpoint,
        headers={name: secret.value for name, secret in config.tracing_headers.items()},
        sample_ratio=settings.sample_ratio,
        service_name=settings.service_name,
        capture_content=settings.capture_content,
        max_queued_spans=settings.max_queued_spans,
        max_batch_spans=settings.max_batch_spans,
        export_interval_s=settings.export_interval_s,
        export_timeout_s=settings.export_timeout_s,
    )
    stats = tracing.stats
    router.metrics.registry.register(
        TraceExportCollector(lambda: (stats.exported, stats.dropped(), stats.queued()))
    )
    # The headers' names only: their values are credentials.
    log.info(
        "tracing: spans to %s (new traces sampled at %g%s%s)",
        settings.otlp_endpoint,
        settings.sample_ratio,
        f", headers {', '.join(sorted(settings.headers))}" if settings.headers else "",
        ", with prompts and answers" if settings.capture_content else "",
    )
    return tracing


def _lease_broker(config: GatewayConfig, redis: RedisClient | None) -> LeaseBroker | None:
    if config.redis is None or redis is None or not config.redis.leases:
        return None
    return LeaseBroker(
        redis,
        key_prefix=config.redis.key_prefix,
        lease_ttl_s=config.redis.lease_ttl_s,
        timeout_s=config.redis.timeout_s,
        on_error=config.redis.on_lease_error,
    )


async def _close_all(running: dict[str, Running]) -> None:
    for one in running.values():
        await one.aclose()


def _early_stops(provider: Provider) -> int:
    if isinstance(provider, ReplicaSet):
        return sum(r.upstream.tool_call_early_stops for r in provider.replicas)
    return provider.tool_call_early_stops
