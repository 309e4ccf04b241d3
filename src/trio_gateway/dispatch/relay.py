"""One request's structured concurrency: the answer produced in the request's own task, and
a watcher that cancels it when the client goes away.

::

    nursery (the request's cancel scope)
    ├── watcher: the client went away → cancel the scope
    └── producer (the caller's task): run_attempts → emit → the sink → the client

On the gateway's own HTTP/1.x server the watcher is no task at all: the server's one hang-up
watch for every connection calls the request's ``HangUpWatch`` (``fronts/chat.HangUpCancel``),
and an answer with nothing else beside it runs without a nursery.

Cancelling the scope closes the upstream response at once, which is what makes vLLM abort and
free the sequence's KV cache. There is no buffer of the gateway's own between the two sides and
no second task: each batch of events the upstream gave in one read goes to the sink (the front's
writer) as it is, and a sink whose client is slow makes the producer wait, so the upstream waits
too (its socket's buffers are the only ones). A sink that finds its client behind for longer than
``client_stall_timeout_s`` raises :class:`ClientStalled`; the upstream is released and the
connection dropped. One task per answer also means one task switch per chunk, not two.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import attrs
import trio

from trio_gateway.accounting.admission import Admission, prices_of, record_cost
from trio_gateway.core.errors import ContentFiltered, GatewayError, InternalError, ShuttingDown
from trio_gateway.core.events import Event, ResponseStarted, Usage
from trio_gateway.core.filters import OutputBlocked, OutputFilters, StreamFilter
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.usage import UsageMeter, UsageRecord, usage_record
from trio_gateway.dispatch.router import Plan
from trio_gateway.ops.access import current as current_request
from trio_gateway.ops.drain import SHUTDOWN
from trio_gateway.ops.spans import Emit, RequestSpan

log = logging.getLogger("trio_gateway")

Item = Event | GatewayError
Watch = Callable[[trio.CancelScope, "Outcome"], Awaitable[None]]
DropConnection = Callable[[], object]


class HangUpWatch(Protocol):
    """A disconnect watcher's work done without a task (``fronts/chat.HangUpCancel``)."""

    def start(self, scope: trio.CancelScope, outcome: Outcome) -> None:
        """From now on, a hang-up of the client cancels ``scope`` and tells ``outcome``."""

    def stop(self) -> None:
        """No more of that (the answer is over)."""


class ClientStalled(Exception):
    """The client has been behind for longer than the stall period."""


class ClientLeft(Exception):
    """The client's connection is closed or reset: nothing more can be written."""


class Sink(Protocol):
    """Where one answer goes, called from the producer's task: a front's writer."""

    async def put(self, items: Sequence[Item]) -> None:
        """Deliver ``items`` (the events of one upstream read, or one final error). May wait
        while the client is slow; raises :class:`ClientStalled` once it has been behind for
        the stall period, :class:`ClientLeft` once it is gone."""

    async def end(self) -> None:
        """The answer is over (after its last ``put``, however it ended but by cancellation)."""


CLIENT_GONE = "client_gone"
CLIENT_STALL = "client_stall"


@attrs.define
class Outcome:
    """How one request ended, for logs and metrics."""

    cancelled: str | None = None  # CLIENT_GONE, CLIENT_STALL, or a front's own cause
    error: GatewayError | None = None
    provider: str | None = None  # the provider whose answer the client got
    first_event_at: float | None = None
    usage: Usage | None = None  # the vendor's final count
    # The usage so far of the last attempt's stream, left by the provider shell when it ended:
    # what a cut stream is billed.
    meter: UsageMeter = attrs.field(factory=UsageMeter)
    # The output filters that acted on the answer ("name:action"), for its usage record.
    filtered: tuple[str, ...] = ()

    def observe(self, event: Event) -> None:
        if self.first_event_at is None:
            self.first_event_at = trio.current_time()
        if isinstance(event, ResponseStarted):
            self.provider = event.provider
        elif isinstance(event, Usage):
            self.usage = event


def record(
    plan: Plan,
    outcome: Outcome,
    started_at: float,
    *,
    request: ChatRequest,
    request_id: str = "",
    started_wall: float | None = None,
    admission: Admission | None = None,
) -> UsageRecord:
    """One request's metrics and its one usage record, whichever front served it. Its cost is
    at the prices its admission held (what its budget is billed), else at those of the plan's
    providers."""
    router = plan.router
    error = outcome.error
    provider = outcome.provider or (error.provider if error else None) or ""
    now = trio.current_time()
    first_event_at = outcome.first_event_at
    ttft_s = None if first_event_at is None else first_event_at - started_at
    duration_s = now - started_at
    usage_rec = usage_record(
        request_id=request_id,
        key=request.key_name,
        alias=plan.alias,
        provider=provider or None,
        cancelled=outcome.cancelled,
        error_code=error.code if error is not None else None,
        emitted=first_event_at is not None,
        usage=outcome.usage,
        partial=outcome.meter.partial,
        prompt_estimate=request.prompt_estimate,
        ttft_s=ttft_s,
        duration_s=duration_s,
        started_at=time.time() if started_wall is None else started_wall,
        endpoint=request.front or request.kind.value,
        filtered=",".join(outcome.filtered) or None,
        priority=request.priority,
        dropped_tools=",".join(request.dropped_tools) or None,
    )
    if provider:
        prices = admission.prices if admission is not None and admission.prices else None
        if prices is None:
            prices = {p.name: prices_of(p.config) for p in plan.upstreams if p.name == provider}
        if cost := record_cost(prices, usage_rec):
            usage_rec = attrs.evolve(usage_rec, cost_nanos=cost)
            if usage_rec.key is not None:
                router.today.add(usage_rec.key, cost, usage_rec.started_at)
    router.usage.offer(usage_rec)
    if (context := current_request()) is not None:
        context.record(usage_rec)
    if outcome.cancelled is not None:
        result, code = "cancelled", outcome.cancelled
    elif error is not None:
        result, code = "error", error.code
    else:
        result, code = "ok", ""
    metrics = router.metrics
    metrics.request(plan.alias, provider, result, code)
    metrics.request_priority(plan.alias, request.priority, result)
    router.recent.request(provider, now, error=result == "error", ttft_s=ttft_s)
    metrics.request_ended(
        plan.alias,
        provider,
        cancelled=outcome.cancelled,
        ttft_s=ttft_s,
        duration_s=duration_s,
        usage=outcome.usage,
    )
    return usage_rec


async def relay(
    request: ChatRequest,
    plan: Plan,
    *,
    sink: Sink,
    client_stall_timeout_s: float,
    watch: Sequence[Watch] = (),
    hang_up: HangUpWatch | None = None,
    drop_connection: DropConnection | None = None,
    request_id: str = "",
    admission: Admission | None = None,
    response_id: str | None = None,
) -> Outcome:
    """``watch`` runs beside the producer (a disconnect watcher, a stall watchdog) and may
    cancel the request's scope. ``hang_up``, where the server offers it, does a disconnect
    watcher's work with no task of the request's own.
    ``drop_connection`` is called when the client stalls: a connection whose answer stopped
    half-way cannot be used again.
    ``request_id`` names the request's usage record; ``admission`` (a keyed request's budget
    hold) is settled from that record, however the request ended. ``response_id`` is the id
    the client sees (its span's ``gen_ai.response.id``; the request id where none is given)."""
    outcome = Outcome()
    context = current_request()
    span = context.span if context is not None else None
    if span is not None:
        span.request(request, response_id or request_id)
    started_at = trio.current_time()
    started_wall = time.time()
    scope = trio.CancelScope()
    try:
        if hang_up is not None:
            hang_up.start(scope, outcome)
        if watch:
            async with trio.open_nursery() as nursery:
                for watcher in watch:
                    nursery.start_soon(watcher, scope, outcome)
                await _produce(
                    request,
                    plan,
                    outcome,
                    sink,
                    client_stall_timeout_s,
                    drop_connection,
                    scope,
                    span,
                )
                nursery.cancel_scope.cancel()
        else:
            # No task beside the producer: no nursery either (thousands of answers at once).
            await _produce(
                request, plan, outcome, sink, client_stall_timeout_s, drop_connection, scope, span
            )
    except BaseException as exc:
        # Cancelled from outside the request's own scope: the server is stopping. It arrives
        # through the request's nursery, so as a group of Cancelled, not a bare one.
        if _only_cancelled(exc):
            outcome.cancelled = outcome.cancelled or SHUTDOWN
        raise
    finally:
        if hang_up is not None:
            hang_up.stop()
        usage_rec = record(
            plan,
            outcome,
            started_at,
            request=request,
            request_id=request_id,
            started_wall=started_wall,
            admission=admission,
        )
        if admission is not None:
            # At the prices the request was admitted with (a reload may have changed them, or
            # removed its provider, meanwhile). Shielded inside, with a short deadline: a
            # cancelled request is billed too.
            await plan.router.limits.settle(admission, usage_rec)
    return outcome


class _Emit:
    """The producer's way to the client: each batch of events to the sink; a client that
    stalled or left cancels the request. Methods of one small object, not closures: a
    request holds them as long as it runs (thousands at once)."""

    __slots__ = ("_drop_connection", "_outcome", "_scope", "_sink")

    def __init__(
        self,
        outcome: Outcome,
        sink: Sink,
        scope: trio.CancelScope,
        drop_connection: DropConnection | None,
    ) -> None:
        self._outcome = outcome
        self._sink = sink
        self._scope = scope
        self._drop_connection = drop_connection

    async def emit(self, events: list[Event]) -> None:
        observe = self._outcome.observe
        for event in events:
            observe(event)
        try:
            await self._sink.put(events)
        except ClientStalled:
            await self.left(CLIENT_STALL)
        except ClientLeft:
            await self.left(CLIENT_GONE)

    async def left(self, cause: str) -> None:
        outcome = self._outcome
        outcome.cancelled = outcome.cancelled or cause
        self._scope.cancel(reason=cause)
        if cause == CLIENT_STALL and self._drop_connection is not None:
            self._drop_connection()
        await trio.lowlevel.checkpoint()  # raises Cancelled: unwinds the upstream


class _Filtered:
    """The hook of the output filters (``core/filters.py``): every answer of an alias with
    ``output_filters`` passes through here between the provider's events and the front's sink,
    whichever front it is, so every front gets them. A ``block`` says what came before the match
    and raises :class:`ContentFiltered`, which ends the attempt (the upstream is closed: vLLM
    aborts) and reaches the front as the answer's error: an error response when nothing was
    said yet, else in band."""

    __slots__ = ("_emit", "_filter", "_outcome", "_plan")

    def __init__(
        self,
        filters: OutputFilters,
        emit: Callable[[list[Event]], Awaitable[None]],
        outcome: Outcome,
        plan: Plan,
    ) -> None:
        self._filter = StreamFilter(filters)
        self._emit = emit
        self._outcome = outcome
        self._plan = plan

    async def emit(self, events: list[Event]) -> None:
        stream = self._filter
        try:
            out = stream.events(events)
        except OutputBlocked as blocked:
            self._count()
            if blocked.events:
                await self._emit(blocked.events)
            name = blocked.rule.name
            raise ContentFiltered(
                f"the answer was stopped by the output filter {name!r}",
                filter_name=name,
                provider=blocked.provider,
            ) from None
        if stream.matched:
            self._count()
        if out:
            await self._emit(out)

    def _count(self) -> None:
        matched = self._filter.matched
        counter = self._plan.router.metrics.filter_matches
        outcome = self._outcome
        for rule in matched:
            counter.labels(self._plan.alias, rule.name, rule.action).inc()
            noted = f"{rule.name}:{rule.action}"
            if noted not in outcome.filtered:
                outcome.filtered += (noted,)
        matched.clear()


async def _produce(
    request: ChatRequest,
    plan: Plan,
    outcome: Outcome,
    sink: Sink,
    client_stall_timeout_s: float,
    drop_connection: DropConnection | None,
    scope: trio.CancelScope,
    span: RequestSpan | None = None,
) -> None:
    """Runs the request in ``scope``, which the client's leaving or stalling cancels (having
    set ``outcome.cancelled`` first) and so does the drain's end (which sets nothing): one
    scope, not one each, as thousands of answers hold theirs at once. The last words (an error,
    the end) are said outside it."""
    to_client = _Emit(outcome, sink, scope, drop_connection)
    drain = plan.router.drain
    error: GatewayError | None = None
    with drain.track(scope):
        try:
            if drain.stopping:
                raise ShuttingDown(
                    "the gateway is shutting down; retry elsewhere", retry_after_s=1.0
                )
            emit: Emit = to_client.emit
            if span is not None:
                # What the client gets (after the filters): finish reasons, captured content.
                emit = span.observe(emit)
            if plan.filters.output is not None:
                emit = _Filtered(plan.filters.output, emit, outcome, plan).emit
            await plan.router.run(request, plan, emit, outcome.meter, span)
        except GatewayError as exc:
            error = exc
        except Exception as exc:
            log.exception("internal error while serving %s", request.alias)
            error = InternalError(f"internal error: {exc.__class__.__name__}")
    if outcome.cancelled is not None:
        return  # the client left, stalled or cancelled: nobody to say anything to
    if scope.cancelled_caught:
        # The drain ended (it alone cancels without a cause in ``outcome``): the upstream is
        # closed; tell the client, then end cleanly.
        outcome.cancelled = SHUTDOWN
        error = ShuttingDown("the gateway shut down before the answer finished")
    # The last words get the stall period, no more: a client that takes nothing is not waited
    # for (and is no longer holding an upstream).
    with trio.move_on_after(client_stall_timeout_s):
        try:
            if error is not None:
                outcome.error = error
                await sink.put([error])
            await sink.end()
        except ClientStalled:
            await to_client.left(CLIENT_STALL)
        except ClientLeft:
            await to_client.left(CLIENT_GONE)


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)
