"""From a validated request to a stream of events: admission, attempts and failover."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import trio

from trio_gateway.config import AliasConfig
from trio_gateway.errors import (
    AllProvidersFailed,
    GatewayError,
    Overloaded,
    RequestError,
)
from trio_gateway.events import Event
from trio_gateway.providers.upstream import Emit, Upstream
from trio_gateway.request import ChatRequest
from trio_gateway.routing import attempt_order, eligible_providers, resolve_alias


class Router:
    """Holds the aliases and the providers' runtime state, shared by every front."""

    def __init__(
        self,
        aliases: dict[str, AliasConfig],
        upstreams: Mapping[str, Upstream],
        rng: random.Random | None = None,
    ) -> None:
        self.aliases = aliases
        self.upstreams = upstreams
        self._rng = rng or random.Random()

    def plan(self, request: ChatRequest) -> list[Upstream]:
        """The providers to try, in order. Raises before anything is sent upstream."""
        alias = resolve_alias(self.aliases, request.alias)
        eligible = eligible_providers(request.alias, alias, request.required)
        return [self.upstreams[p.name] for p in attempt_order(eligible, self._rng)]


async def _acquire(upstream: Upstream) -> bool:
    # acquire() checkpoints first and would refuse a free slot under a zero timeout.
    try:
        upstream.gate.acquire_nowait()
        return True
    except trio.WouldBlock:
        pass
    with trio.move_on_after(upstream.config.queue_timeout_s):
        await upstream.gate.acquire()
        return True
    return False


async def run_attempts(request: ChatRequest, plan: Sequence[Upstream], emit: Emit) -> None:
    """Try each provider in turn until one answers.

    A new attempt is allowed only while nothing has been emitted: once the client has seen an
    event, an error goes to the client as it is. Errors that are the request's fault go back at
    once: the next provider would say the same.
    """
    failures: list[GatewayError] = []
    for upstream in plan:
        emitted = False

        async def tracked(event: Event) -> None:
            nonlocal emitted
            emitted = True
            await emit(event)

        if not await _acquire(upstream):
            failures.append(
                Overloaded(
                    f"{upstream.name}: all {upstream.config.max_inflight} slots busy for "
                    f"{upstream.config.queue_timeout_s:g} s",
                    provider=upstream.name,
                )
            )
            continue
        try:
            await upstream.stream_chat(request, tracked)
            return
        except RequestError:
            raise
        except GatewayError as exc:
            if emitted:
                raise
            failures.append(exc)
        finally:
            upstream.gate.release()
    if failures and all(isinstance(f, Overloaded) for f in failures):
        names = ", ".join(f.provider or "?" for f in failures)
        raise Overloaded(
            f"every provider of {request.alias!r} is at capacity ({names}); retry shortly",
            retry_after_s=1.0,
        )
    if len(failures) == 1:
        raise failures[0]
    raise AllProvidersFailed(failures)
