"""One request's structured concurrency: an upstream producer, a client consumer, a watcher.

::

    nursery (the request's cancel scope)
    ├── producer: run_attempts → emit → bounded channel   (deadline: client_stall_timeout_s)
    ├── watcher:  the client went away → cancel the scope
    └── consumer: channel → the client (runs in the caller's task)

Cancelling the scope closes the upstream response at once, which is what makes vLLM abort and
free the sequence's KV cache. The bounded channel is the only buffer between the two sides: a
client that stops reading fills it, the producer's deadline passes, and the upstream is released.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from trio_gateway.errors import GatewayError, InternalError
from trio_gateway.events import Event
from trio_gateway.pipeline import run_attempts
from trio_gateway.providers.upstream import Upstream
from trio_gateway.request import ChatRequest

log = logging.getLogger("trio_gateway")

Item = Event | GatewayError
Consume = Callable[[trio.MemoryReceiveChannel[Item]], Awaitable[None]]
Watch = Callable[[trio.CancelScope, "Outcome"], Awaitable[None]]

CLIENT_GONE = "client_gone"
CLIENT_STALL = "client_stall"


@attrs.define
class Outcome:
    """How one request ended, for logs and metrics."""

    cancelled: str | None = None  # CLIENT_GONE, CLIENT_STALL, or a front's own cause
    error: GatewayError | None = None


async def relay(
    request: ChatRequest,
    plan: Sequence[Upstream],
    *,
    buffer_events: int,
    client_stall_timeout_s: float,
    consume: Consume,
    watch: Watch | None = None,
) -> Outcome:
    outcome = Outcome()
    send_channel, receive_channel = trio.open_memory_channel[Item](buffer_events)
    async with trio.open_nursery() as nursery:
        scope = nursery.cancel_scope

        async def emit(event: Event) -> None:
            try:
                send_channel.send_nowait(event)
                return
            except trio.WouldBlock:
                pass
            with trio.move_on_after(client_stall_timeout_s) as stall:
                await send_channel.send(event)
            if stall.cancelled_caught:
                outcome.cancelled = outcome.cancelled or CLIENT_STALL
                scope.cancel(reason=CLIENT_STALL)
                await trio.lowlevel.checkpoint()  # raises Cancelled: unwinds the upstream

        async def produce() -> None:
            async with send_channel:
                try:
                    await run_attempts(request, plan, emit)
                except GatewayError as exc:
                    outcome.error = exc
                    await _send_final(send_channel, exc, client_stall_timeout_s)
                except Exception as exc:
                    log.exception("internal error while serving %s", request.alias)
                    error = InternalError(f"internal error: {exc.__class__.__name__}")
                    outcome.error = error
                    await _send_final(send_channel, error, client_stall_timeout_s)

        nursery.start_soon(produce)
        if watch is not None:
            nursery.start_soon(watch, scope, outcome)
        async with receive_channel:
            await consume(receive_channel)
        scope.cancel()
    return outcome


async def _send_final(
    channel: trio.MemorySendChannel[Item], error: GatewayError, timeout_s: float
) -> None:
    # A consumer that already finished has nobody to tell.
    with trio.move_on_after(timeout_s), contextlib.suppress(trio.BrokenResourceError):
        await channel.send(error)
