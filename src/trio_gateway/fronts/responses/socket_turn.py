"""One ``response.create`` on a Responses WebSocket, served as a request like any other: the
turn read as ``POST /v1/responses`` reads it (``turn.py``, with the socket's own recent
responses looked in first), routed, admitted and relayed (``dispatch/relay.py``: gates,
failover, budgets, filters, the usage record with ``endpoint = "responses_ws"``, metrics), its
events written to the socket with the lane's ``stream_id``, then kept: in the socket's memory
whatever its ``store``, and in the store as well with ``store: true``.

A create refused before it reached a provider (its body, its key, a missing
``previous_response_id``, a limit) is the socket's ``error`` on its lane, with a usage record
and an access line as any refused request has. ``generate: false`` reaches no provider: the
response is remembered, and answered ``response.created``, ``response.in_progress``,
``response.completed`` with no output.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Final

import attrs
import trio

from trio_gateway.accounting.response_memory import MemoryResponseStore
from trio_gateway.accounting.response_records import Stored, load_record
from trio_gateway.config.schema import ServerConfig
from trio_gateway.core.errors import (
    GatewayError,
    InternalError,
    InvalidRequest,
    UnsupportedParameter,
)
from trio_gateway.core.events import ResponseDone
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.usage import refused_record
from trio_gateway.dispatch.relay import (
    ClientLeft,
    ClientStalled,
    DropConnection,
    Item,
    Outcome,
    relay,
)
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.responses.events import ResponseWriter
from trio_gateway.fronts.responses.prefixes import Prefixes
from trio_gateway.fronts.responses.route import count_dropped
from trio_gateway.fronts.responses.service import ResponsesService
from trio_gateway.fronts.responses.socket_events import CreateMessage, dumps, error_event
from trio_gateway.fronts.responses.turn import Turn, prepare_turn
from trio_gateway.ops.access import RequestContext, log_access, request_context
from trio_gateway.ops.tracing import trace_for

log = logging.getLogger("trio_gateway")

FRONT_WS: Final = "responses_ws"
ROUTE: Final = "WS /v1/responses"


@attrs.define(kw_only=True)
class Session:
    """What every turn of one socket shares: the gateway's parts, the socket's key and
    handshake, its memory, and its way out."""

    router: Router
    server: ServerConfig
    service: ResponsesService
    key: ApiKey | None
    memory: MemoryResponseStore
    memory_bytes: int
    new_request_id: Callable[[], str]
    # Writes texts to the socket, waiting for room (ClientStalled past the stall period,
    # ClientLeft once the socket is closing).
    send_texts: Callable[[Sequence[str]], Awaitable[None]]
    drop_connection: DropConnection | None
    # The conversations of its memory's responses as already read (None: read back each turn).
    prefixes: Prefixes | None = None
    # From the handshake, for every turn: affinity, priority, trace.
    session_id: str | None = None
    priority_header: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None


class TurnCancel:
    """A turn's cancellation, from the socket (it closed, dropped, or stopped): before the
    relay, its own scope; during it, the relay's (as ``HangUpCancel`` does for an HTTP client
    that hangs up: the scope at once, and the upstream connection shut without waiting for the
    producer's turn), so vLLM hears of it as fast as over HTTP."""

    __slots__ = ("_outcome", "_relay", "cause", "context", "on_response", "scope", "writer")

    def __init__(self, context: RequestContext) -> None:
        self.context = context
        # The turn's answer once it has one, and who is told its response id (the socket,
        # which answers a steer on the response's lane).
        self.writer: ResponseWriter | None = None
        self.on_response: Callable[[str], None] | None = None
        self.scope = trio.CancelScope()
        self.cause: str | None = None
        self._relay: trio.CancelScope | None = None
        self._outcome: Outcome | None = None

    def start(self, scope: trio.CancelScope, outcome: Outcome) -> None:
        self._relay, self._outcome = scope, outcome

    def stop(self) -> None:
        self._relay = self._outcome = None

    def cancel(self, cause: str) -> None:
        if self.cause is not None:
            return
        self.cause = cause
        relay_scope, outcome = self._relay, self._outcome
        if relay_scope is None or outcome is None:
            self.scope.cancel(reason=cause)
            return
        outcome.cancelled = outcome.cancelled or cause
        relay_scope.cancel(reason=cause)
        if self.context.abort_upstream is not None:
            self.context.abort_upstream()


class LaneAnswer:
    """A turn's answer, as the relay's sink: each event as one message (with the lane's
    ``stream_id``), written as it comes; an error before the first event is the socket's
    ``error``, after it ``response.failed``."""

    def __init__(self, session: Session, stream_id: str | None) -> None:
        self._session = session
        self._stream_id = stream_id
        self.frames: list[str] = []
        self.writer: ResponseWriter | None = None
        self._said = False

    def frame(self, event: dict[str, Any]) -> bytes:
        """The writer's events, as the socket's messages (``ResponseWriter``'s ``frame``)."""
        if self._stream_id is not None:
            event["stream_id"] = self._stream_id
        self.frames.append(dumps(event))
        return b""

    async def put(self, items: Sequence[Item]) -> None:
        writer = self.writer
        assert writer is not None
        for item in items:
            if not isinstance(item, GatewayError):
                writer.encode(item)
            elif self._said or self.frames:
                writer.fail(item)
            else:
                event = error_event(item, stream_id=self._stream_id, sequence_number=0)
                self.frames.append(dumps(event))
        await self._flush()

    async def end(self) -> None:
        if not self._said and not self.frames:
            await self.put([InternalError("the answer ended before it began")])

    async def _flush(self) -> None:
        if self.frames:
            self._said = True
            frames, self.frames = self.frames, []
            await self._session.send_texts(frames)


async def serve_create(session: Session, create: CreateMessage, cancel: TurnCancel) -> None:
    """One create, from its message to its record; never raises but for cancellation (the
    socket's to handle). ``cancel`` is how the socket stops it."""
    context = cancel.context
    started_wall, started = time.time(), trio.current_time()
    with request_context(context):
        try:
            with cancel.scope:
                await _answer(session, create, cancel, context)
            if cancel.scope.cancelled_caught and context.outcome is None:
                # Stopped before its relay (waiting for admission, say): recorded as left.
                duration_s = trio.current_time() - started
                cause = cancel.cause or "client_gone"
                record_refusal(session, context, cause, started_wall, duration_s, cancelled=True)
        except Exception:
            log.exception("responses socket: turn %s failed", context.request_id)
        finally:
            log_access(context, trio.current_time() - started)
            end_span(context)


def new_context(session: Session, request_id: str) -> RequestContext:
    """A create's context. With tracing on, each create is a server span of its own, a child
    of the handshake's ``traceparent`` when it had one: one trace for the agent's session."""
    tracing = session.router.tracing
    if tracing is None:
        trace, span = trace_for(session.traceparent, session.tracestate), None
    else:
        span, trace = tracing.start(ROUTE, session.traceparent, session.tracestate)
    return RequestContext(
        request_id=request_id,
        route=ROUTE,
        trace=trace,
        priority_header=session.priority_header,
        span=span,
    )


def end_span(context: RequestContext) -> None:
    if context.span is not None:
        context.span.end(None, context.alias)


async def _answer(
    session: Session, create: CreateMessage, cancel: TurnCancel, context: RequestContext
) -> None:
    router, service = session.router, session.service
    stream_id = create.stream_id
    started_wall, started = time.time(), trio.current_time()
    metric = router.metrics.responses_socket_creates
    if log.isEnabledFor(logging.DEBUG):
        log.debug("responses socket: %s", describe(create))
    try:
        generate, body = _turn_body(create)
        turn = await prepare_turn(
            router,
            service,
            body,
            session.key,
            front=FRONT_WS,
            size=create.size,
            depth_known=create.depth_known,
            local=(session.memory,),
            session_id=session.session_id,
            count_dropped=partial(count_dropped, router, FRONT_WS),
            prefixes=session.prefixes,
        )
        if cancel.on_response is not None:
            cancel.on_response(turn.response_id)
        if not generate:
            await _remember(session, turn, stream_id, context)
            metric.labels("remembered").inc()
            return
        plan = router.plan(turn.request)
        admission = await router.admit(session.key, turn.request, plan)
    except GatewayError as exc:
        metric.labels("refused").inc()
        record_refusal(session, context, exc.code, started_wall, trio.current_time() - started)
        event = error_event(exc, stream_id=stream_id, sequence_number=0)
        with contextlib.suppress(ClientLeft, ClientStalled):
            await session.send_texts([dumps(event)])
        return
    metric.labels("answered").inc()
    keeping = bool(turn.parsed.echo["store"]) and turn.base_size <= service.max_record_bytes
    echo = turn.parsed.echo if keeping else {**turn.parsed.echo, "store": False}
    answer = LaneAnswer(session, stream_id)
    answer.writer = writer = turn.writer(
        service,
        created_at=int(time.time()),
        echo=echo,
        streaming=True,
        keep=partial(_fits, turn, service.max_record_bytes) if keeping else None,
        frame=answer.frame,
    )
    cancel.writer = writer
    with service.writing(turn.owner, turn.response_id):
        await relay(
            turn.request,
            plan,
            sink=answer,
            client_stall_timeout_s=session.server.client_stall_timeout_s,
            hang_up=cancel,
            drop_connection=session.drop_connection,
            request_id=context.request_id,
            admission=admission,
            response_id=turn.response_id,
        )
        await _keep(session, turn, writer)


def describe(create: CreateMessage) -> str:
    """A create as the debug log shows it: its shape, never its content."""
    body = create.body
    items = body.get("input")
    count = len(items) if isinstance(items, list) else int(items is not None)
    previous = body.get("previous_response_id")
    return (
        f"create lane={create.stream_id or '-'} generate={create.generate} "
        f"previous={previous if isinstance(previous, str) else '-'} input_items={count} "
        f"tools={len(body.get('tools') or ())} bytes={create.size}"
    )


def _fits(turn: Turn, max_bytes: int, response: dict[str, Any]) -> bool:
    return turn.fits(response, max_bytes)


def _turn_body(create: CreateMessage) -> tuple[bool, dict[str, Any]]:
    """Whether to answer, and the create's body as a POST body; what the mode does not take is
    refused here, on the create's lane."""
    if not isinstance(create.generate, bool):
        raise InvalidRequest("'generate' must be a boolean", param="generate")
    if create.body.get("background") is True:
        raise UnsupportedParameter(
            "'background' is not supported in WebSocket mode", param="background"
        )
    # Every answer on a socket streams: ``stream`` is accepted (Codex sends it) and ignored.
    body = {k: v for k, v in create.body.items() if k != "background"}
    body["stream"] = True
    return create.generate, body


async def _remember(
    session: Session, turn: Turn, stream_id: str | None, context: RequestContext
) -> None:
    """``generate: false``: the response, with no output, kept in the socket's memory only, so
    a later turn continues from its input (Codex's warm-up: its instructions and tools)."""
    answer = LaneAnswer(session, stream_id)
    writer = turn.writer(
        session.service,
        created_at=int(time.time()),
        echo=turn.parsed.echo,
        streaming=True,
        frame=answer.frame,
    )
    writer.encode(ResponseDone(finish_reason="stop"))
    record = turn.record(writer.response())
    await _memorize(session, turn, record)
    context.alias = turn.request.alias
    context.key = turn.request.key_name
    context.outcome = "remembered"
    with contextlib.suppress(ClientLeft, ClientStalled):
        await session.send_texts(answer.frames)


async def _keep(session: Session, turn: Turn, writer: ResponseWriter) -> None:
    """A finished answer (completed or incomplete): into the socket's memory, and the store
    when it asked to be stored and fits (its last event said so)."""
    if writer.status not in ("completed", "incomplete"):
        return
    response = writer.response()
    record = turn.record(response)
    await _memorize(session, turn, record)
    if response.get("store"):
        with trio.CancelScope(shield=True):
            await session.service.put(turn.owner, record)


async def _memorize(session: Session, turn: Turn, record: Stored) -> None:
    """The turn's record into the socket's memory (when it fits), and its conversation as
    read into the socket's prefixes: its own items read back from the record's text, as the
    next turn's walk would read them."""
    if record.size > session.memory_bytes:
        return
    await session.memory.put(turn.owner, record)
    history = turn.parsed.history
    if session.prefixes is not None and history is not None:
        session.prefixes.keep(
            turn.owner,
            turn.response_id,
            history,
            load_record(record.id, record.text).items(),
            opener=session.service.sealer.open,
            turns=turn.history_turns + 1,
            size=turn.history_bytes + record.size,
        )


def record_refusal(
    session: Session,
    context: RequestContext,
    code: str,
    started_wall: float,
    duration_s: float,
    *,
    cancelled: bool = False,
) -> None:
    """A create that ended before its relay (which records the others), under the alias its
    body named (``prepare_turn`` put it in the context)."""
    router = session.router
    record = refused_record(
        request_id=context.request_id,
        key=session.key.name if session.key is not None else None,
        alias=context.alias,
        error_code=code,
        started_at=started_wall,
        duration_s=duration_s,
        cancelled=cancelled,
        endpoint=FRONT_WS,
    )
    router.usage.offer(record)
    router.metrics.request("", "", record.outcome, code)
    context.record(record)
