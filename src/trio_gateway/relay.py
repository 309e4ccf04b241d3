"""One request's structured concurrency: an upstream producer, a client consumer, a watcher.

::

    nursery (the request's cancel scope)
    ├── producer: run_attempts → emit → bounded channel   (deadline: client_stall_timeout_s)
    ├── watcher:  the client went away → cancel the scope
    └── consumer: channel → the client (runs in the caller's task)

Cancelling the scope closes the upstream response at once, which is what makes vLLM abort and
free the sequence's KV cache. The bounded channel is the only buffer between the two sides: a
client that stops reading, or reads slower than the answer comes, keeps it full and the producer
waiting; once that wait outweighs the time the answer flowed by ``client_stall_timeout_s`` the
producer's deadline passes and the upstream is released.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import attrs
import trio

from trio_gateway.access import current as current_request
from trio_gateway.accounting import Admission
from trio_gateway.drain import SHUTDOWN
from trio_gateway.errors import GatewayError, InternalError, ShuttingDown
from trio_gateway.events import Event, ResponseStarted, Usage
from trio_gateway.pipeline import Plan
from trio_gateway.request import ChatRequest
from trio_gateway.usage import UsageMeter, UsageRecord, usage_record

log = logging.getLogger("trio_gateway")

Item = Event | GatewayError
Consume = Callable[[trio.MemoryReceiveChannel[Item]], Awaitable[None]]
Watch = Callable[[trio.CancelScope, "Outcome"], Awaitable[None]]
DropConnection = Callable[[], object]
# Whether the client's connection has room for more bytes now; None when unknown.
ClientWritable = Callable[[], "bool | None"]

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
    request: ChatRequest | None = None,
    request_id: str = "",
    started_wall: float | None = None,
) -> UsageRecord:
    """One request's metrics and its one usage record, whichever front served it."""
    router = plan.router
    error = outcome.error
    provider = outcome.provider or (error.provider if error else None) or ""
    now = trio.current_time()
    first_event_at = outcome.first_event_at
    ttft_s = None if first_event_at is None else first_event_at - started_at
    duration_s = now - started_at
    usage_rec = usage_record(
        request_id=request_id,
        key=getattr(request, "key_name", None),
        alias=plan.alias,
        provider=provider or None,
        cancelled=outcome.cancelled,
        error_code=error.code if error is not None else None,
        emitted=first_event_at is not None,
        usage=outcome.usage,
        partial=outcome.meter.partial,
        messages=request.body.get("messages") if request is not None else None,
        ttft_s=ttft_s,
        duration_s=duration_s,
        started_at=time.time() if started_wall is None else started_wall,
    )
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
    buffer_events: int,
    client_stall_timeout_s: float,
    consume: Consume,
    watch: Watch | None = None,
    drop_connection: DropConnection | None = None,
    client_writable: ClientWritable | None = None,
    request_id: str = "",
    admission: Admission | None = None,
) -> Outcome:
    """``drop_connection`` is called when the client stalls past ``client_stall_timeout_s``:
    the consumer is then blocked writing to it, and only closing the connection unblocks it.
    ``client_writable`` tells a client that is behind from a gateway that is (its socket still
    has room): only the first is dropped.
    ``request_id`` names the request's usage record; ``admission`` (a keyed request's budget
    hold) is settled from that record, however the request ended."""
    outcome = Outcome()
    started_at = trio.current_time()
    started_wall = time.time()
    try:
        await _relay(
            request,
            plan,
            outcome,
            buffer_events,
            client_stall_timeout_s,
            consume,
            watch,
            drop_connection,
            client_writable,
        )
    except BaseException as exc:
        # Cancelled from outside the request's own scope: the server is stopping. It arrives
        # through the request's nursery, so as a group of Cancelled, not a bare one.
        if _only_cancelled(exc):
            outcome.cancelled = outcome.cancelled or SHUTDOWN
        raise
    finally:
        usage_rec = record(
            plan,
            outcome,
            started_at,
            request=request,
            request_id=request_id,
            started_wall=started_wall,
        )
        if admission is not None:
            upstream = plan.router.upstreams.get(usage_rec.provider or "")
            # Shielded inside, with a short deadline: a cancelled request is billed too.
            await plan.router.limits.settle(
                admission, usage_rec, upstream.config if upstream is not None else None
            )
    return outcome


async def _relay(
    request: ChatRequest,
    plan: Plan,
    outcome: Outcome,
    buffer_events: int,
    client_stall_timeout_s: float,
    consume: Consume,
    watch: Watch | None,
    drop_connection: DropConnection | None,
    client_writable: ClientWritable | None,
) -> None:
    send_channel, receive_channel = trio.open_memory_channel[Item](buffer_events)
    async with trio.open_nursery() as nursery:
        scope = nursery.cancel_scope

        # A leaky bucket of the time the client kept the answer waiting: each blocked send
        # adds its wait, each stretch the answer flowed takes as much away. A client that reads
        # nothing is dropped after exactly the stall period; one that reads, but slower than
        # the answer comes, keeps the producer waiting most of the time and is dropped soon
        # after (no single wait need last a period: the kernel wakes a writer every few KiB).
        debt_s = 0.0
        flowing_since: float | None = None

        async def emit(event: Event) -> None:
            nonlocal debt_s, flowing_since
            outcome.observe(event)
            try:
                send_channel.send_nowait(event)
                return
            except trio.WouldBlock:
                pass
            blocked_at = trio.current_time()
            if flowing_since is not None:
                debt_s = max(0.0, debt_s - (blocked_at - flowing_since))
            while True:
                with trio.move_on_at(blocked_at + client_stall_timeout_s - debt_s) as stall:
                    await send_channel.send(event)
                flowing_since = trio.current_time()
                debt_s += flowing_since - blocked_at
                if not stall.cancelled_caught:
                    return
                if client_writable is None or not client_writable():
                    break
                # The client takes all it is given: the gateway is behind (a fast upstream, a
                # busy process), and dropping the client would not help it.
                debt_s, blocked_at = 0.0, flowing_since
            outcome.cancelled = outcome.cancelled or CLIENT_STALL
            scope.cancel(reason=CLIENT_STALL)
            if drop_connection is not None:
                drop_connection()
            await trio.lowlevel.checkpoint()  # raises Cancelled: unwinds the upstream

        async def produce() -> None:
            drain = plan.router.drain
            async with send_channel:
                error: GatewayError | None = None
                with drain.track() as producer:
                    try:
                        if drain.stopping:
                            raise ShuttingDown(
                                "the gateway is shutting down; retry elsewhere", retry_after_s=1.0
                            )
                        await plan.router.run(request, plan, emit, outcome.meter)
                    except GatewayError as exc:
                        error = exc
                    except Exception as exc:
                        log.exception("internal error while serving %s", request.alias)
                        error = InternalError(f"internal error: {exc.__class__.__name__}")
                if producer.cancelled_caught:
                    # The drain ended: the upstream is closed; tell the client, then end cleanly.
                    outcome.cancelled = outcome.cancelled or SHUTDOWN
                    error = ShuttingDown("the gateway shut down before the answer finished")
                if error is not None:
                    outcome.error = error
                    await _send_final(send_channel, error, client_stall_timeout_s)

        nursery.start_soon(produce)
        if watch is not None:
            nursery.start_soon(watch, scope, outcome)
        async with receive_channel:
            await consume(receive_channel)
        scope.cancel()


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


async def _send_final(
    channel: trio.MemorySendChannel[Item], error: GatewayError, timeout_s: float
) -> None:
    # A consumer that already finished has nobody to tell.
    with trio.move_on_after(timeout_s), contextlib.suppress(trio.BrokenResourceError):
        await channel.send(error)
