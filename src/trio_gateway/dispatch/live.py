"""The providers a gateway serves now: built from a config, each with its own connections and
background services (probe, scrape), and swapped by a reload without cutting a stream.

Each provider owns an ``AsyncExitStack`` (its connection pools) and a cancel scope (its probes
and scrapes), so a reload can retire one provider and leave the others alone: a retired
provider's services stop at once, and its connections close only once the requests it still
holds (and those queued at its gate by a plan made before the reload) have ended.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import AsyncExitStack

import attrs
import trio

from trio_gateway.capacity.gate import LeaseBroker, LocalGate, SharedGate, reservation_of
from trio_gateway.capacity.gate_kinds import Gate
from trio_gateway.capacity.health import ProviderHealth, probe_service
from trio_gateway.capacity.host_gate import HostGate, HostGates
from trio_gateway.config.schema import ProviderConfig, Secret
from trio_gateway.dispatch.scrape import scrape_service
from trio_gateway.providers.credentials import credential_source
from trio_gateway.providers.openai_compatible.replicas import (
    Replica,
    ReplicaSet,
    replica_config,
    replica_label,
)
from trio_gateway.providers.upstream import Upstream

log = logging.getLogger("trio_gateway")

# How often a retired provider is checked for requests it still holds.
RETIRE_POLL_S = 0.5

Provider = Upstream | ReplicaSet


@attrs.frozen
class Gates:
    """How this process makes a provider's gate: leases shared by every gateway on one Redis
    (``broker``); else, in a worker of ``[server] workers``, slots shared by the host's workers
    through the supervisor (``host``); else its own slots."""

    broker: LeaseBroker | None = None
    host: HostGates | None = None
    workers: int = 1

    def dials(self, config: ProviderConfig) -> int:
        """This process's share of an endpoint's ``max_dials_in_flight``: split evenly among
        the host's workers (at least one each), so that together they stay within it. Split,
        not shared through the supervisor: a dial is short, and a storm's thousands of them
        would each cost a round trip to it."""
        return max(1, config.max_dials_in_flight // self.workers)

    def make(self, key: str, config: ProviderConfig) -> Gate:
        """The gate of ``key`` ("vllm", "vllm@10.0.0.1:8000"), of one endpoint's ``config``."""
        if self.broker is not None:
            return self.broker.gate(key, config.max_inflight, reservation_of(config))
        if self.host is not None:
            return self.host.gate(key, config.max_inflight, reservation_of(config))
        return LocalGate(config.max_inflight, reservation_of(config))

    def resize(self, gate: Gate, config: ProviderConfig) -> None:
        """``gate`` to one endpoint's new ``config`` (max_inflight, reservation)."""
        gate.resize(config.max_inflight, reservation_of(config))


@attrs.define(eq=False)
class Running:
    """One provider as it runs: what requests use, what it holds open, what runs for it."""

    provider: Provider
    # The health of a single-endpoint provider (a replicated one holds its replicas' own).
    health: ProviderHealth | None
    stack: AsyncExitStack
    services: trio.CancelScope | None = None

    def members(self) -> Iterator[tuple[str, Upstream, ProviderHealth]]:
        """Each endpoint with its name in logs and the health its probe feeds."""
        if isinstance(self.provider, ReplicaSet):
            for replica in self.provider.replicas:
                yield f"{self.provider.name}@{replica.name}", replica.upstream, replica.health
        else:
            assert self.health is not None
            yield self.provider.name, self.provider, self.health

    def resize(self, config: ProviderConfig, gates: Gates) -> None:
        """Take a new weight, max_inflight or queue_timeout_s (reload.Change.RESIZED): the gate
        keeps the requests it holds, and a smaller one admits again once enough have ended."""
        provider = self.provider
        if isinstance(provider, ReplicaSet):
            provider.config = config
            for replica in provider.replicas:
                own = replica_config(config, replica.upstream.config.endpoint)
                replica.upstream.config = own
                gates.resize(replica.upstream.gate, own)
                replica.upstream.resize_dials(gates.dials(own))
        else:
            provider.config = config
            gates.resize(provider.gate, config)
            provider.resize_dials(gates.dials(config))

    def idle(self) -> bool:
        """No attempt runs on it, and none waits at a gate of its own. A leased or host gate
        is the same object for its successor (same key), so its waiters may be the successor's."""
        return all(
            upstream.active == 0
            and (
                isinstance(upstream.gate, SharedGate | HostGate)
                or upstream.statistics().waiting == 0
            )
            for _, upstream, _ in self.members()
        )

    async def aclose(self) -> None:
        for _, upstream, _ in self.members():
            upstream.close_idle()
        await self.stack.aclose()


async def open_provider(
    config: ProviderConfig, api_keys: Mapping[str, Secret], gates: Gates
) -> Running:
    """Its connection pools, gates and health; nothing is dialled yet."""
    stack = AsyncExitStack()
    # One trust for every client of the provider: the chat exchange, /load and /metrics, the
    # Vertex token exchange (http1/tls.py).
    tls = Upstream.trust(config)
    try:
        now = trio.current_time()
        if config.endpoints:
            replicas = []
            for url in config.endpoints:
                own = replica_config(config, url)
                label = replica_label(url)
                client = await stack.enter_async_context(Upstream.make_client(own, tls))
                upstream = Upstream(
                    own,
                    credential_source(own, api_keys, client),
                    client,
                    gate=gates.make(f"{config.name}@{label}", own),
                    tls=tls,
                    max_dials_in_flight=gates.dials(own),
                )
                replicas.append(Replica(label, upstream, ProviderHealth(own, now=now)))
            return Running(ReplicaSet(config, replicas), None, stack)
        client = await stack.enter_async_context(Upstream.make_client(config, tls))
        upstream = Upstream(
            config,
            credential_source(config, api_keys, client),
            client,
            gate=gates.make(config.name, config),
            tls=tls,
            max_dials_in_flight=gates.dials(config),
        )
        return Running(upstream, ProviderHealth(config, now=now), stack)
    except BaseException:
        await stack.aclose()
        raise


async def serve_services(
    running: Running, *, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED
) -> None:
    """The provider's probes (and scrapes of a vLLM's /load and /metrics), the keeper of its
    streams' read deadlines and the expiry of its idle connections, until the returned scope
    is cancelled; each first probe has run by the time this has started."""
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            for name, upstream, health in running.members():
                await nursery.start(upstream.expire_idle)
                await nursery.start(upstream.serve_read_deadlines)
                if not upstream.config.probe:
                    continue
                await nursery.start(
                    probe_service, name, upstream.config, health, upstream.probe, upstream.read_load
                )
                if upstream.config.type == "openai_compatible":
                    await nursery.start(scrape_service, upstream)
            task_status.started(scope)
            await trio.sleep_forever()


async def retire(running: Running) -> None:
    """Stop the provider's services now; close its connections once its last request ended."""
    if running.services is not None:
        running.services.cancel(reason="provider retired by a reload")
    try:
        # The gates announce no "idle": a retired provider is looked at twice a second.
        while not running.idle():  # noqa: ASYNC110
            await trio.sleep(RETIRE_POLL_S)
        log.info("reload: provider %s retired (its last request has ended)", running.provider.name)
    finally:
        # Also at shutdown, which cancels the wait: its pools close either way.
        with trio.CancelScope(shield=True):
            await running.aclose()
