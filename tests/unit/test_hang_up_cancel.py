"""fronts/chat.HangUpCancel: what a client's hang-up does to its request, with no task."""

from __future__ import annotations

import socket

import trio

from trio_gateway.access import RequestContext, request_context
from trio_gateway.fronts.chat import HangUpCancel
from trio_gateway.fronts.h1_serve import HangUps
from trio_gateway.relay import CLIENT_GONE, Outcome
from trio_gateway.tracing import new_trace


def context() -> RequestContext:
    return RequestContext(request_id="r", route="POST /v1/chat/completions", trace=new_trace())


async def test_a_hang_up_cancels_tells_and_shuts_the_upstream_at_once() -> None:
    hang_ups = HangUps()
    answered = trio.Event()
    a, b = socket.socketpair()
    with a, b:
        ctx = context()
        aborted: list[str] = []
        ctx.abort_upstream = lambda: aborted.append("upstream")
        scope, outcome = trio.CancelScope(), Outcome()
        watch = HangUpCancel(hang_ups, a.fileno(), answered)
        with request_context(ctx):
            watch.start(scope, outcome)
        assert len(hang_ups) == 1
        watch()  # what HangUps calls, from whichever task looked
        assert scope.cancel_called
        assert outcome.cancelled == CLIENT_GONE
        assert aborted == ["upstream"]
        watch.stop()
        assert len(hang_ups) == 0


async def test_a_hang_up_after_the_answer_is_no_cancellation() -> None:
    hang_ups = HangUps()
    answered = trio.Event()
    a, b = socket.socketpair()
    with a, b:
        ctx = context()
        aborted: list[str] = []
        ctx.abort_upstream = lambda: aborted.append("upstream")
        scope, outcome = trio.CancelScope(), Outcome()
        watch = HangUpCancel(hang_ups, a.fileno(), answered)
        with request_context(ctx):
            watch.start(scope, outcome)
        answered.set()
        watch()
        assert not scope.cancel_called
        assert outcome.cancelled is None
        assert aborted == []
        watch.stop()


async def test_an_earlier_cause_is_kept_and_no_upstream_is_no_matter() -> None:
    hang_ups = HangUps()
    a, b = socket.socketpair()
    with a, b:
        scope, outcome = trio.CancelScope(), Outcome(cancelled="client_stall")
        watch = HangUpCancel(hang_ups, a.fileno(), trio.Event())
        with request_context(context()):  # between attempts: no upstream response open
            watch.start(scope, outcome)
        watch()
        assert scope.cancel_called
        assert outcome.cancelled == "client_stall"
        watch.stop()
