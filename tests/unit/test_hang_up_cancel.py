"""fronts/chat.HangUpCancel: what a client's hang-up does to its request, with no task."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import httpx
import trio

from tests.unit.test_mut_upstream import COMPLETION, collect, shell
from trio_gateway.dispatch.relay import CLIENT_GONE, Outcome
from trio_gateway.fronts.chat import HangUpCancel
from trio_gateway.http1.hang_ups import HangUps
from trio_gateway.ops.access import RequestContext, request_context
from trio_gateway.ops.tracing import new_trace


@attrs.define
class Started:
    watch: HangUpCancel
    hang_ups: HangUps
    scope: trio.CancelScope
    outcome: Outcome
    aborted: list[str]


@contextmanager
def started(
    answered: trio.Event, outcome: Outcome | None = None, *, upstream: bool = True
) -> Iterator[Started]:
    """A request's hang-up watch, started inside its request context (with an upstream
    response open to abort, unless not ``upstream``)."""
    hang_ups = HangUps()
    a, b = socket.socketpair()
    with a, b:
        context = RequestContext(
            request_id="r", route="POST /v1/chat/completions", trace=new_trace()
        )
        aborted: list[str] = []
        if upstream:
            context.abort_upstream = lambda: aborted.append("upstream")
        scope = trio.CancelScope()
        outcome = outcome if outcome is not None else Outcome()
        watch = HangUpCancel(hang_ups, a.fileno(), answered)
        with request_context(context):
            watch.start(scope, outcome)
        yield Started(watch, hang_ups, scope, outcome, aborted)
        watch.stop()


async def test_a_hang_up_cancels_tells_and_shuts_the_upstream_at_once() -> None:
    with started(trio.Event()) as s:
        assert len(s.hang_ups) == 1
        s.watch()  # what HangUps calls, from whichever task looked
        assert s.scope.cancel_called
        assert s.outcome.cancelled == CLIENT_GONE
        assert s.aborted == ["upstream"]
    assert len(s.hang_ups) == 0


async def test_a_hang_up_after_the_answer_is_no_cancellation() -> None:
    answered = trio.Event()
    with started(answered) as s:
        answered.set()
        s.watch()
        assert not s.scope.cancel_called
        assert s.outcome.cancelled is None
        assert s.aborted == []


async def test_an_earlier_cause_is_kept_and_no_upstream_is_no_matter() -> None:
    # Between attempts: no upstream response open.
    with started(trio.Event(), Outcome(cancelled="client_stall"), upstream=False) as s:
        s.watch()
        assert s.scope.cancel_called
        assert s.outcome.cancelled == "client_stall"


async def test_the_request_can_be_aborted_from_the_context_while_its_head_is_awaited() -> None:
    """A client that leaves while vLLM queues or generates a whole answer: the hang-up watch
    ends the exchange at once through the context, as it does once the head came."""
    context = RequestContext(request_id="r", route="POST /v1/chat/completions", trace=new_trace())
    while_waiting: list[object] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        while_waiting.append(context.abort_upstream)
        return httpx.Response(200, json=COMPLETION)

    with request_context(context):
        await collect(shell(handler))
    assert while_waiting and callable(while_waiting[0])
    assert context.abort_upstream is None
