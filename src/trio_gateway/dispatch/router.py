"""From a validated request to a stream of events: admission, attempts, spill and failover.

Admission happens before anything is sent: a provider's gate (``max_inflight`` slots, gate.py;
shared by every alias that names the provider, and through Redis by every gateway process when
``[redis]`` is configured) must grant a slot within ``queue_timeout_s``, or the request spills
to the next provider; an alias with ``on_saturated = "queue"`` waits in its own bounded queue
instead. A new attempt after a failure is
allowed only while the client has seen nothing.

Waiters at a gate are served by their rank (``queue_rank``): lower priority numbers first, in
arrival order within a priority, a waiting request gaining one class per the alias's
``priority_aging_s`` (capacity/priority.py has the bound this gives). A provider's
``reserved_slots`` are taken only by requests of a priority up to its
``reserved_for_priority_at_most``: the others wait while only reserved slots are free.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

import attrs
import trio

from trio_gateway.accounting.admission import Admission, Limits, Reserve, local_limits
from trio_gateway.capacity.gate import LocalGate
from trio_gateway.capacity.gate_kinds import Gate
from trio_gateway.capacity.health import ProviderHealth, log_transition
from trio_gateway.capacity.host_gate import HostGate
from trio_gateway.config.schema import AliasConfig, FilterConfig
from trio_gateway.core.errors import (
    AllProvidersFailed,
    ContentFiltered,
    DescriptorsExhausted,
    GatewayError,
    Overloaded,
    QuotaExhausted,
    RequestError,
    UnusableAnswer,
    UpstreamError,
    UpstreamOverloaded,
    UpstreamRateLimited,
)
from trio_gateway.core.events import Event
from trio_gateway.core.filter_match import FilterSpec
from trio_gateway.core.filters import NO_FILTERS, AliasFilters, alias_filters, input_match
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.usage import NULL_SINK, UsageMeter, UsageSink
from trio_gateway.dispatch.routing import eligible_providers, order_by_health, resolve_alias
from trio_gateway.ops.drain import Drain
from trio_gateway.ops.metrics import Metrics, ProviderGauges, ReplicaGauges
from trio_gateway.ops.spans import RequestSpan, Tracing
from trio_gateway.ops.status import RecentStats, TodaySpend
from trio_gateway.providers.openai_compatible.replicas import GroupHealth, ReplicaSet, replica_label
from trio_gateway.providers.registry import dialect_for
from trio_gateway.providers.upstream import Emit, Upstream

# Without a Retry-After, a provider that said 429/529 rests this long.
DEFAULT_COOL_DOWN_S = 1.0
# A provider whose account is out of quota rests this long before it is tried again.
QUOTA_COOL_DOWN_S = 300.0
# Weight of the newest sample in a provider's moving average of time spent holding a slot.
SERVICE_TIME_EWMA_ALPHA = 0.2
INITIAL_SERVICE_TIME_S = 2.0

# A provider: one endpoint, or several replicas of one served model.
Provider = Upstream | ReplicaSet
Health = ProviderHealth | GroupHealth


@attrs.frozen
class Member:
    """Where one attempt goes: a provider's upstream (a replica of it, or itself) and the health
    that attempt's result feeds."""

    upstream: Upstream
    health: ProviderHealth
    name: str  # for logs: the provider's name, and a replica's host:port after an "@"


@attrs.frozen(kw_only=True)
class Plan:
    """The providers to try for one request, in order; decided before anything is sent."""

    alias: str
    config: AliasConfig
    upstreams: tuple[Provider, ...]
    router: Router
    # The providers' health when planned: a reload that replaces a provider leaves this
    # request's attempts feeding the health of the one it runs on.
    health: Mapping[str, Health]
    # The alias's filters when planned (dispatch/relay.py runs the answer through them).
    filters: AliasFilters = NO_FILTERS


class Router:
    """The aliases and every provider's runtime state (gate, health), shared by all fronts."""

    def __init__(
        self,
        aliases: dict[str, AliasConfig],
        upstreams: Mapping[str, Provider],
        *,
        rng: random.Random | None = None,
        health: Mapping[str, ProviderHealth] | None = None,
        filters: Mapping[str, FilterConfig] | None = None,
    ) -> None:
        self.aliases = aliases
        self.filters = _compile_filters(aliases, filters or {})
        self.upstreams = upstreams
        self.health = _health_of(upstreams, health or {})
        self.metrics = Metrics(self.gauges)
        # The status page's last minutes (status.py): fed once per request and per spill.
        self.recent = RecentStats(upstreams)
        # Each key's cost today, for the status page's top keys (fed by relay.record).
        self.today = TodaySpend()
        # Where every request's usage record goes (server.py sets the configured ledger).
        self.usage: UsageSink = NULL_SINK
        # Budgets and rate limits of keyed requests (server.py sets Redis when configured).
        self.limits: Limits = local_limits()
        # The gateway's own spans (server.py sets them when [tracing] is configured).
        self.tracing: Tracing | None = None
        self.drain = Drain()
        self._rng = rng or random.Random()
        # Requests waiting in each alias's queue; an alias with none has no entry (so one a
        # reload removed leaves nothing behind once its last waiter is gone).
        self._queued: dict[str, int] = {}
        self._service_time_s = dict.fromkeys(upstreams, INITIAL_SERVICE_TIME_S)

    def apply(
        self,
        aliases: dict[str, AliasConfig],
        upstreams: Mapping[str, Provider],
        health: Mapping[str, ProviderHealth],
        filters: Mapping[str, FilterConfig] | None = None,
    ) -> None:
        """A reload's new aliases, providers and filters, all at once (no checkpoint in here):
        a request planned before keeps the providers and filters its plan holds; the alias
        queues' counts (by name, a removed alias's until its last waiter leaves) and the
        service times of what stays carry over."""
        self.aliases = aliases
        self.filters = _compile_filters(aliases, filters or {})
        self.upstreams = upstreams
        self.health = _health_of(upstreams, health)
        self.recent = self.recent.keeping(upstreams)
        self._service_time_s = {
            name: self._service_time_s.get(name, INITIAL_SERVICE_TIME_S) for name in upstreams
        }

    def gauges(self) -> list[ProviderGauges]:
        now = trio.current_time()
        out = []
        for name, upstream in self.upstreams.items():
            stats = upstream.statistics()
            health = self.health[name]
            out.append(
                ProviderGauges(
                    provider=name,
                    in_flight=stats.in_flight,
                    queued=stats.waiting,
                    max_inflight=stats.max_inflight,
                    state=health.state.value,
                    cooling_down=health.cooling_down(now),
                    upstream_load=health.upstream_load,
                    last_error=health.last_error,
                    endpoints=_endpoint_gauges(upstream),
                )
            )
        return out

    def ready(self) -> dict[str, list[str]]:
        """Per alias, the providers that are healthy or starting (empty: not ready)."""
        now = trio.current_time()
        return {
            alias: [p.name for p in config.providers if self.health[p.name].in_rotation(now)]
            for alias, config in self.aliases.items()
        }

    def screen(self, request: ChatRequest) -> None:
        """Refuse a request its alias's input filters match (``ContentFiltered``), and mark it
        screened. Needs no event loop: a front reading a big body runs it in a worker thread
        (fronts/off_loop.py), where a scan of megabytes holds no other request up."""
        filters = self.filters.get(request.alias, NO_FILTERS)
        if filters.input is not None:
            rule = input_match(filters.input, request.body)
            if rule is not None:
                self.metrics.filter_matches.labels(request.alias, rule.name, "refuse").inc()
                raise ContentFiltered(
                    f"the request matches the input filter {rule.name!r}", filter_name=rule.name
                )
        request.screened = True

    def plan(self, request: ChatRequest) -> Plan:
        """Raises (unknown alias, missing capability, a request its input filters refuse)
        before anything is sent upstream. A request :meth:`screen` passed is not scanned
        again."""
        alias = resolve_alias(self.aliases, request.alias)
        if not request.screened:
            self.screen(request)
        filters = self.filters.get(request.alias, NO_FILTERS)
        eligible = eligible_providers(request.alias, alias, request.required, request.kind)
        now = trio.current_time()
        health = self.health
        live = {p.name for p in eligible if health[p.name].in_rotation(now)}
        ordered = order_by_health(eligible, live, self._rng)
        upstreams = self.upstreams
        return Plan(
            alias=request.alias,
            config=alias,
            upstreams=tuple([upstreams[p.name] for p in ordered]),
            router=self,
            health=health,
            filters=filters,
        )

    async def admit(self, key: ApiKey | None, request: ChatRequest, plan: Plan) -> Admission | None:
        """The key's budget and rate limits for ``request`` (``Limits.admit``). Its hold counts,
        for each provider of the plan, the most output the request as that provider's vendor
        receives it may produce: the client's limit, Anthropic's clamped ``max_tokens``, or,
        with no limit sent, the model's cap (``providers/output_caps.py``)."""
        if key is None:
            return None
        reserves = tuple(
            Reserve(u.config, dialect_for(u.config.type).max_output_tokens(request, u.config))
            for u in plan.upstreams
        )
        return await self.limits.admit(key, request.body, reserves, request.kind)

    def _retry_after_s(self, upstream: Provider, waiting: int) -> float:
        """How long until a slot is likely free: the queue ahead, served at the provider's
        recent pace."""
        per_slot_s = (
            self._service_time_s.get(upstream.name, INITIAL_SERVICE_TIME_S)
            / upstream.statistics().max_inflight
        )
        return float(max(1, math.ceil((waiting + 1) * per_slot_s)))

    def _served(self, upstream: Provider, held_s: float) -> None:
        old = self._service_time_s.get(upstream.name)
        if old is not None:  # None: retired by a reload
            self._service_time_s[upstream.name] = old + SERVICE_TIME_EWMA_ALPHA * (held_s - old)

    def members(self, plan: Plan, provider: Provider, request: ChatRequest) -> list[Member]:
        """Where ``request`` may go within ``provider``, in the order to try."""
        if isinstance(provider, ReplicaSet):
            now = trio.current_time()
            return [
                Member(r.upstream, r.health, f"{provider.name}@{r.name}")
                for r in provider.candidates(request, now)
            ]
        health = plan.health[provider.name]
        assert isinstance(health, ProviderHealth)
        return [Member(provider, health, provider.name)]

    async def _admit_queued(
        self,
        plan: Plan,
        request: ChatRequest,
        borrower: object,
        rank: float,
        span: RequestSpan | None = None,
    ) -> tuple[Provider, Member]:
        """``on_saturated = "queue"``: a free slot at any weight > 0 provider in the plan (that
        shares load, it is not a spill), else wait in the alias's bounded queue for the first
        slot that frees among them."""
        config = plan.config
        candidates = [u for u in plan.upstreams if u.config.weight > 0] or list(plan.upstreams)
        everyone = [(u, m) for u in candidates for m in self.members(plan, u, request)]
        for provider, member in everyone:
            if await _try_take(member.upstream.gate, borrower, request.priority):
                return provider, member
        first = candidates[0]
        waiting = self._queued.get(plan.alias, 0)
        if waiting >= config.max_queued:
            self.metrics.refusals.labels(plan.alias, "queue_full").inc()
            raise Overloaded(
                f"alias {plan.alias!r}: queue full ({config.max_queued} waiting)",
                retry_after_s=self._retry_after_s(first, waiting),
            )
        self._queued[plan.alias] = waiting + 1
        if span is not None:
            span.event("queued", {"trio_gateway.queue": plan.alias})
        try:
            won = await _first_slot(
                everyone, borrower, config.max_queue_wait_s, rank, request.priority
            )
        finally:
            left = self._queued.pop(plan.alias) - 1
            if left:
                self._queued[plan.alias] = left
        if won is not None:
            return won
        self.metrics.refusals.labels(plan.alias, "queue_timeout").inc()
        raise Overloaded(
            f"alias {plan.alias!r}: no slot within {config.max_queue_wait_s:g} s",
            retry_after_s=self._retry_after_s(first, self._queued.get(plan.alias, 0)),
        )

    async def run(
        self,
        request: ChatRequest,
        plan: Plan,
        emit: Emit,
        meter: UsageMeter | None = None,
        span: RequestSpan | None = None,
    ) -> None:
        """Try each provider in turn until one answers; within a replicated provider, each
        replica in its routing order.

        Errors that are the request's fault go back at once: the next provider would say the
        same. Once anything was emitted, an error goes to the client as it is. ``meter`` gets
        each attempt's usage so far (for billing a cut stream); ``span`` (tracing on) the
        events of the way: queued, admitted, spill, failover.
        """
        borrower = object()
        rank = queue_rank(trio.current_time(), request.priority, plan.config.priority_aging_s)
        failures: list[GatewayError] = []
        pre_admitted: tuple[Provider, Member] | None = None
        if plan.config.on_saturated == "queue":
            pre_admitted = await self._admit_queued(plan, request, borrower, rank, span)
        order = list(plan.upstreams)
        if pre_admitted is not None:
            order.remove(pre_admitted[0])
            order.insert(0, pre_admitted[0])
        previous: Provider | None = None
        for provider in order:
            if previous is not None:
                # Saturation moves a request (a spill); a failure moves an attempt (failover).
                spill = isinstance(failures[-1], Overloaded)
                if spill:
                    moves = self.metrics.spills
                    self.recent.spill(previous.name, trio.current_time())
                else:
                    moves = self.metrics.failovers
                moves.labels(plan.alias, previous.name, provider.name).inc()
                if span is not None:
                    span.event(
                        "spill" if spill else "failover",
                        {"trio_gateway.from": previous.name, "trio_gateway.to": provider.name},
                    )
            previous = provider
            members = self.members(plan, provider, request)
            member: Member | None = None
            if pre_admitted is not None and provider is pre_admitted[0]:
                member = pre_admitted[1]
                members.remove(member)
            while True:
                if member is None:
                    member = await _acquire(
                        provider, members, borrower, rank, request.priority, span
                    )
                    if member is None:
                        failures.append(
                            Overloaded(
                                f"{provider.name}: all {provider.statistics().max_inflight} "
                                f"slots busy for {provider.config.queue_timeout_s:g} s",
                                provider=provider.name,
                            )
                        )
                        break
                    members.remove(member)
                if span is not None:
                    span.event("admitted", {"trio_gateway.provider": member.name})
                failure = await self._attempt(member, borrower, request, emit, meter, provider)
                if failure is None:
                    return
                failures.append(failure)
                # The attempt failed before the client saw anything: another replica of the
                # same provider, while there is one, before the next provider.
                if span is not None and members:
                    span.event("failover", {"trio_gateway.from": member.name})
                member = None
                if not members:
                    break
        raise self._final_error(plan, failures)

    async def _attempt(
        self,
        member: Member,
        borrower: object,
        request: ChatRequest,
        emit: Emit,
        meter: UsageMeter | None,
        provider: Provider,
    ) -> GatewayError | None:
        """One attempt on the slot ``borrower`` holds, which it gives back. Returns a failure
        that may be retried elsewhere (nothing reached the client yet); raises what may not (the
        request's own fault, a failure after the first event)."""
        upstream, health = member.upstream, member.health
        emitted = False

        async def tracked(events: list[Event]) -> None:
            nonlocal emitted
            if not emitted:
                emitted = True
                # No other attempt can follow an answer begun (an error now goes to the client).
                request.release_body(upstream.config.type)
            await emit(events)

        started = trio.current_time()
        before = health.state
        upstream.active += 1
        try:
            await upstream.stream_chat(request, tracked, meter)
        except RequestError:
            health.success()  # it answered, and correctly so
            raise
        except DescriptorsExhausted:
            raise  # the gateway's own limit: no provider's fault, and the next would meet it
        except GatewayError as exc:
            self._note_failure(health, exc)
            if emitted:
                raise
            return exc
        else:
            health.success()
            return None
        finally:
            upstream.active -= 1
            self._served(provider, trio.current_time() - started)
            log_transition(member.name, before, health)
            await _give_back(upstream.gate, borrower)

    def _note_failure(self, health: ProviderHealth, exc: GatewayError) -> None:
        now = trio.current_time()
        if isinstance(exc, UpstreamRateLimited | UpstreamOverloaded):
            # Busy, not broken: rest for as long as it asked, without counting a failure.
            health.cool_down(now + (exc.retry_after_s or DEFAULT_COOL_DOWN_S))
        elif isinstance(exc, UnusableAnswer):
            pass  # the provider answered: not a failure of the provider
        elif isinstance(exc, QuotaExhausted):
            # Waiting a second does not bring quota back: keep requests away for longer.
            health.cool_down(now + QUOTA_COOL_DOWN_S)
        elif isinstance(exc, UpstreamError):
            health.failure(exc.message, now=now)

    def _final_error(self, plan: Plan, failures: list[GatewayError]) -> GatewayError:
        if failures and all(isinstance(f, Overloaded) for f in failures):
            self.metrics.refusals.labels(plan.alias, "saturated").inc()
            names = ", ".join(f.provider or "?" for f in failures)
            first = plan.upstreams[0]
            return Overloaded(
                f"every provider of {plan.alias!r} is at capacity ({names}); retry shortly",
                retry_after_s=self._retry_after_s(first, first.statistics().waiting),
            )
        if len(failures) == 1:
            return failures[0]
        return AllProvidersFailed(failures)


def _compile_filters(
    aliases: Mapping[str, AliasConfig], filters: Mapping[str, FilterConfig]
) -> dict[str, AliasFilters]:
    """Each alias's filters, compiled (an Aho-Corasick automaton per field: built once here,
    not per request). The config's checks have made sure every name is defined."""
    # attrs.asdict keeps tuples as tuples.
    specs = {name: FilterSpec(name=name, **attrs.asdict(f)) for name, f in filters.items()}
    # Aliases that name the same filters share one compiled set.
    built: dict[tuple[tuple[str, ...], tuple[str, ...]], AliasFilters] = {}
    out = {}
    for name, alias in aliases.items():
        names = (alias.output_filters, alias.input_filters)
        if names == ((), ()):
            continue
        if names not in built:
            built[names] = alias_filters([specs[f] for f in names[0]], [specs[f] for f in names[1]])
        out[name] = built[names]
    return out


def _health_of(
    upstreams: Mapping[str, Provider], given: Mapping[str, ProviderHealth]
) -> dict[str, Health]:
    """A replicated provider's health is its replicas'; a single one's is given (the one its
    probe feeds) or new."""
    now = trio.current_time()
    out: dict[str, Health] = {}
    for name, upstream in upstreams.items():
        if isinstance(upstream, ReplicaSet):
            out[name] = upstream.health
        else:
            out[name] = given.get(name) or ProviderHealth(upstream.config, now=now)
    return out


def _endpoint_gauges(provider: Provider) -> tuple[ReplicaGauges, ...]:
    if isinstance(provider, ReplicaSet):
        return tuple(
            _endpoint(r.name, r.upstream, r.health.state.value, r.health.upstream_load)
            for r in provider.replicas
        )
    return (_endpoint(replica_label(provider.config.endpoint), provider, "", None),)


def _endpoint(name: str, upstream: Upstream, state: str, load: int | None) -> ReplicaGauges:
    stats = upstream.statistics()
    signals, cache = upstream.signals, upstream.prefix_cache
    return ReplicaGauges(
        replica=name,
        in_flight=stats.in_flight,
        max_inflight=stats.max_inflight,
        state=state,
        upstream_load=signals.load if signals.load is not None else load,
        waiting=signals.waiting,
        kv_cache_usage=signals.kv_cache_usage,
        prefix_cache_queries=cache.queries,
        prefix_cache_hits=cache.hits,
        prefix_cache_hit_ratio=cache.ratio,
    )


async def _try_take(gate: Gate, borrower: object, priority: int) -> bool:
    """A free slot, if there is one. A local gate's ``try_acquire`` and ``release`` each end in
    a schedule point, a turn of trio's run loop (about 65K instructions, docs/benchmarks.md)
    that a request has no use for here: the upstream exchange right after is its first wait.
    Cancellation is still checked before the take, as ``try_acquire`` checks it."""
    if isinstance(gate, LocalGate):
        await trio.lowlevel.checkpoint_if_cancelled()
        return gate.try_acquire_nowait(borrower, priority)
    return await gate.try_acquire(borrower, priority)


async def _give_back(gate: Gate, borrower: object) -> None:
    """Release ``borrower``'s slot; a local or host gate's without a schedule point (see
    _try_take: the host gate's release is one write to the supervisor)."""
    if isinstance(gate, LocalGate | HostGate):
        gate.release_nowait(borrower)
    else:
        await gate.release(borrower)


def queue_rank(arrived: float, priority: int, aging_s: float) -> float:
    """Where a request waits at a gate: as if it had arrived ``priority x aging_s`` later."""
    return arrived + priority * aging_s


async def _acquire(
    provider: Provider,
    members: list[Member],
    borrower: object,
    rank: float,
    priority: int,
    span: RequestSpan | None = None,
) -> Member | None:
    """A slot on the first of ``members`` that has one free, else on whichever frees one first
    within the provider's ``queue_timeout_s``; None when none did."""
    # acquire() would refuse a free slot under a zero timeout: a free one is taken first.
    for member in members:
        if await _try_take(member.upstream.gate, borrower, priority):
            return member
    if span is not None:
        span.event("queued", {"trio_gateway.queue": provider.name})
    won = await _first_slot(
        [(provider, m) for m in members], borrower, provider.config.queue_timeout_s, rank, priority
    )
    return None if won is None else won[1]


async def _first_slot(
    candidates: list[tuple[Provider, Member]],
    borrower: object,
    timeout_s: float,
    rank: float,
    priority: int,
) -> tuple[Provider, Member] | None:
    """The first of the candidates whose gate grants ``borrower`` a slot within ``timeout_s``;
    the others give theirs back. A slot granted is never lost to the deadline: the winner is
    read after the scope, whatever cancelled it."""
    winner: list[tuple[Provider, Member]] = []
    if not candidates:
        return None
    with trio.move_on_after(timeout_s):
        async with trio.open_nursery() as nursery:

            async def race(candidate: tuple[Provider, Member]) -> None:
                gate = candidate[1].upstream.gate
                await gate.acquire(borrower, rank, priority)
                if winner:  # lost a photo finish: give the slot back
                    await gate.release(borrower)
                    return
                winner.append(candidate)
                nursery.cancel_scope.cancel()

            for candidate in candidates:
                nursery.start_soon(race, candidate)
    return winner[0] if winner else None
