"""``GET /v1/responses`` upgraded to a WebSocket: the Responses API's WebSocket mode
(docs/api.md, "WebSocket mode").

::

    one socket (hypercorn's ASGI websocket scope)
    ├── writer:   outbound queue → websocket.send            the only task that writes
    ├── watchdog: a write blocked a whole stall period → drop the connection
    ├── timers:   max age → websocket_connection_limit_reached, close; idle → close
    ├── drain:    the gateway stopping → close 1001 once nothing answers
    ├── reader:   websocket.receive → parse → lanes (the handler's own task)
    └── lanes nursery: a task per answering lane, its creates one after the other
                       (socket_turn.serve_create: a request like any other)

Which create runs, waits or is refused is ``lanes.py``'s (pure); what each message is,
``socket_events.py``'s. A lane's events wait for room in the outbound queue (a client that
reads slowly slows its upstreams, as over HTTP), up to the stall period; then the socket is
dropped and every upstream on it closed. The socket's own answers (a refused message) never
wait: past the queue's bound the socket is closed (4001). A socket that closes or drops
cancels every answer on it at once, upstream included (``socket_turn.TurnCancel``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Final

import trio

from trio_gateway.accounting.key_store import KeyStore
from trio_gateway.accounting.response_memory import MemoryResponseStore
from trio_gateway.config.schema import ServerConfig, WebSocketConfig
from trio_gateway.core.errors import (
    ConnectionLimitReached,
    GatewayError,
    InvalidMessage,
    MessageRefused,
    Overloaded,
    ShuttingDown,
    TooManyRequests,
)
from trio_gateway.core.events_codec import CLOSE_GOING_AWAY, CLOSE_SLOW_CONSUMER
from trio_gateway.core.keys import ApiKey
from trio_gateway.dispatch.relay import CLIENT_GONE, CLIENT_STALL, ClientLeft, ClientStalled
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.auth import websocket_handshake
from trio_gateway.fronts.http import Receive, Scope, Send, header
from trio_gateway.fronts.off_loop import off_loop
from trio_gateway.fronts.responses.lanes import Lane, Lanes, Verdict
from trio_gateway.fronts.responses.prefixes import Prefixes
from trio_gateway.fronts.responses.service import service_of
from trio_gateway.fronts.responses.socket_events import (
    CreateMessage,
    SteerMessage,
    dumps,
    error_event,
    parse_client_message,
    steer_failed_event,
)
from trio_gateway.fronts.responses.socket_turn import (
    Session,
    TurnCancel,
    end_span,
    new_context,
    record_refusal,
    serve_create,
)
from trio_gateway.fronts.ws import CloseFrame, SocketPlaces, SocketWriter, refuse_upgrade
from trio_gateway.http1.websocket import SEND_MANY
from trio_gateway.ops.access import log_access, request_context
from trio_gateway.ops.drain import SHUTDOWN

log = logging.getLogger("trio_gateway")

CLOSE_NORMAL: Final = 1000
CLOSE_TOO_BIG: Final = 1009
# Why a socket's answers were stopped, for their records (gateway_cancellations_total).
SOCKET_AGE: Final = "socket_age"
# Messages written at once, at most (one write of the gateway's own server).
MAX_BATCH_MESSAGES: Final = 256
# The socket's responses whose lane a late steer can still be told (their ids, bounded).
RECENT_RESPONSES: Final = 256


class ResponsesSocketFront:
    """Serves every socket on ``/v1/responses``; holds nothing across sockets but their count
    (shared with ``/v1/ws``: ``SocketPlaces``)."""

    def __init__(
        self,
        router: Router,
        server: ServerConfig,
        config: WebSocketConfig,
        new_request_id: Callable[[], str],
        keys: KeyStore | None,
        places: SocketPlaces,
    ) -> None:
        self.router = router
        self.server = server
        self.config = config
        self.new_request_id = new_request_id
        self.keys = keys
        self.places = places

    async def serve(
        self,
        receive: Receive,
        send: Send,
        drop_connection: Callable[[], object] | None = None,
        scope: Scope | None = None,
    ) -> None:
        """One socket, from the handshake until either side closes it. A handshake refused
        (its key, the gateway full or stopping) is answered with a JSON error, never
        upgraded."""
        if (await receive())["type"] != "websocket.connect":
            return
        scope = scope if scope is not None else {}
        try:
            handshake = websocket_handshake(scope)
            key = None if self.keys is None else self.keys.authenticate(handshake.key)
            if self.router.drain.stopping:
                raise ShuttingDown("the gateway is shutting down; retry elsewhere", retry_after_s=1)
            if not self.places.take():
                raise Overloaded(
                    f"{self.places.limit} WebSockets are open on this gateway "
                    "([websocket] max_sockets); retry later or elsewhere",
                    retry_after_s=1.0,
                )
        except GatewayError as exc:
            log.info("refusing a websocket on /v1/responses: %s", exc.code)
            await refuse_upgrade(send, scope, exc)
            return
        try:
            self.router.metrics.responses_sockets.inc()
            await send({"type": "websocket.accept", "subprotocol": handshake.subprotocol})
            session = self._session(scope, key, send, drop_connection)
            # The gateway's own server writes several messages at once (http1/websocket.py).
            batches = SEND_MANY in scope.get("extensions", {})
            await _Socket(self, session, send, batches=batches).run(receive)
        finally:
            self.places.release()

    def _session(
        self,
        scope: Scope,
        key: ApiKey | None,
        send: Send,
        drop_connection: Callable[[], object] | None,
    ) -> Session:
        settings = self.config.responses
        memory = MemoryResponseStore(
            ttl_s=settings.max_age_s,
            max_bytes=settings.memory_bytes,
            key_quota_bytes=settings.memory_bytes,
        )

        def named(name: bytes) -> str | None:
            value = header(scope, name)
            return value.decode("latin-1") if value is not None else None

        async def unset(texts: Sequence[str]) -> None:  # replaced by the socket's own
            raise ClientLeft()

        return Session(
            router=self.router,
            server=self.server,
            service=service_of(self.router),
            key=key,
            memory=memory,
            memory_bytes=settings.memory_bytes,
            prefixes=Prefixes(memory, max_bytes=settings.memory_bytes),
            new_request_id=self.new_request_id,
            send_texts=unset,
            drop_connection=drop_connection,
            session_id=named(b"x-session-id"),
            priority_header=named(b"x-priority"),
            traceparent=named(b"traceparent"),
            tracestate=named(b"tracestate"),
        )


class _Socket:
    def __init__(
        self, front: ResponsesSocketFront, session: Session, send: Send, *, batches: bool
    ) -> None:
        self._front = front
        self._batches = batches
        self._session = session
        session.send_texts = self._send_texts
        self._settings = front.config.responses
        self._stall_s = front.server.client_stall_timeout_s
        self._outbound_send, self._outbound_receive = trio.open_memory_channel[str](
            front.config.max_queued_events
        )
        self._lanes: Lanes[CreateMessage] = Lanes(
            max_lanes=self._settings.max_lanes,
            max_queued_bytes=self._settings.max_queued_bytes,
        )
        self._answering: dict[Lane, TurnCancel] = {}
        self._recent: OrderedDict[str, Lane] = OrderedDict()  # response id → its lane
        self._stopping = False
        # Why the socket is ending (its age, the drain): nothing more starts on it.
        self._ending: str | None = None
        self._flush = False
        self._close: CloseFrame | None = None
        self._changed = trio.Event()  # a lane began or ended (the timers look again)
        self._last_activity = trio.current_time()
        self._opened = trio.current_time()
        self._read_scope = trio.CancelScope()
        self._timers_scope = trio.CancelScope()
        self._writer_idle: trio.CancelScope | None = None
        # With batches, the lanes write beside the writer task (the server orders the writes).
        self._writer = SocketWriter(send, self._stall_s)
        self._watch_scope = trio.CancelScope()
        self._lanes_nursery: trio.Nursery | None = None

    async def run(self, receive: Receive) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write)
            nursery.start_soon(self._watch_writes)
            nursery.start_soon(self._timers)
            async with trio.open_nursery() as lanes:
                self._lanes_nursery = lanes
                with self._read_scope:
                    await self._read(receive)
                # The client left (or _stop already ran): nothing is left to answer.
                self._stop(CLIENT_GONE, None)

    # --- closing ------------------------------------------------------------------------
    def _stop(self, cause: str, close: CloseFrame | None, *, flush: bool = False) -> None:
        """Begin closing: every answer cancelled (its upstream closed at once), what waits
        dropped, no more reading; the writer sends ``close`` (if any) instead of what is still
        queued, or after it with ``flush`` (a graceful close)."""
        if self._stopping:
            return
        self._stopping = True
        self._close, self._flush = close, flush
        if close is not None:
            log.info("closing a websocket on /v1/responses: %d %s", close.code, close.reason)
        self._lanes.take_queued()
        for cancel in list(self._answering.values()):
            cancel.cancel(cause)
        self._read_scope.cancel()
        self._timers_scope.cancel()
        if self._writer_idle is not None:
            self._writer_idle.cancel()

    async def _timers(self) -> None:
        with self._timers_scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_drain)
                await self._age_and_idle()
                nursery.cancel_scope.cancel()

    async def _watch_drain(self) -> None:
        """A stopping gateway starts nothing more on the socket (``shutting_down``); once its
        last answer has ended (within the drain), the socket closes with 1001."""
        await self._front.router.drain.began.wait()
        if self._ending is None:
            self._ending = SHUTDOWN
            self._refuse_queued()
        self._changed.set()

    async def _age_and_idle(self) -> None:
        """The socket's age and its idleness, looked at again whenever one may have come due
        (a lane's start or end, the drain, wake it)."""
        settings = self._settings
        age_at = self._opened + settings.max_age_s
        while True:
            now = trio.current_time()
            if now >= age_at and self._ending is None:
                self._ending = SOCKET_AGE
                self._refuse_queued()
            if self._ending is not None and not self._lanes.busy:
                self._end()
                return
            wake = age_at if self._ending is None else math.inf
            if self._ending is None and not self._lanes.busy:
                idle_at = self._last_activity + settings.idle_timeout_s
                if now >= idle_at:
                    reason = f"idle for {settings.idle_timeout_s:g} s"
                    self._stop(CLIENT_GONE, CloseFrame(code=CLOSE_NORMAL, reason=reason))
                    return
                wake = min(wake, idle_at)
            self._changed = trio.Event()
            with trio.move_on_at(wake):
                await self._changed.wait()

    def _ending_error(self) -> GatewayError:
        """What a create gets once the socket is ending: the drain's refusal, or the API's
        connection limit."""
        if self._ending == SHUTDOWN:
            return ShuttingDown("the gateway is shutting down; retry elsewhere", retry_after_s=1)
        minutes = self._settings.max_age_s / 60
        return ConnectionLimitReached(
            f"Responses websocket connection limit reached ({minutes:g} minutes). "
            "Create a new websocket connection to continue."
        )

    def _refuse_queued(self) -> None:
        """What waits behind an answer when the socket begins to end: refused on its lane."""
        error = self._ending_error()
        for _, create in self._lanes.take_queued():
            self._say(error_event(error, stream_id=create.stream_id, sequence_number=0))

    def _end(self) -> None:
        """Nothing answers any more on an ending socket: the limit said (past its age), then a
        graceful close."""
        if self._ending == SHUTDOWN:
            close = CloseFrame(code=CLOSE_GOING_AWAY, reason="gateway shutting down")
            self._stop(SHUTDOWN, close, flush=True)
            return
        self._say(error_event(self._ending_error()))
        close = CloseFrame(code=CLOSE_NORMAL, reason="websocket_connection_limit_reached")
        self._stop(SOCKET_AGE, close, flush=True)

    # --- writing ------------------------------------------------------------------------
    def _say(self, event: dict[str, object]) -> None:
        """The socket's own message (a refusal): never waits; a client that lets the queue
        fill is closed."""
        if self._stopping:
            return
        try:
            self._outbound_send.send_nowait(dumps(event))
        except trio.WouldBlock:
            limit = self._front.config.max_queued_events
            reason = f"slow consumer: more than {limit} messages waiting to be sent"
            self._stop(CLIENT_STALL, CloseFrame(code=CLOSE_SLOW_CONSUMER, reason=reason))

    async def _send_texts(self, texts: Sequence[str]) -> None:
        """A lane's messages, in order, waiting for room up to the stall period: written at
        once, in one write, by the gateway's own server; else through the writer's queue."""
        if self._batches:
            # Written at once where the kernel has room; a write blocked for a stall period is
            # the watchdog's (_watch_writes): it drops the connection, which ends the write.
            if self._stopping:
                raise ClientLeft()
            await self._writer.send({"type": "websocket.send", "texts": list(texts)})
            return
        for text in texts:
            if self._stopping:
                raise ClientLeft()
            try:
                self._outbound_send.send_nowait(text)
            except trio.WouldBlock:
                with trio.move_on_after(self._stall_s):
                    await self._outbound_send.send(text)
                    continue
                raise ClientStalled() from None

    async def _watch_writes(self) -> None:
        """A write blocked for a stall period drops the connection (``SocketWriter.watch``)."""
        with self._watch_scope:
            await self._writer.watch(self._stuck)

    def _stuck(self) -> None:
        log.info("dropping a websocket on /v1/responses whose client stopped reading")
        self._stop(CLIENT_STALL, None)
        if self._session.drop_connection is not None:
            self._session.drop_connection()

    async def _write(self) -> None:
        try:
            await self._write_all()
        finally:
            self._watch_scope.cancel()

    async def _write_all(self) -> None:
        while not self._stopping:
            text: str | None = None
            with trio.CancelScope() as idle:
                self._writer_idle = idle
                text = await self._outbound_receive.receive()
            self._writer_idle = None
            if text is None or (self._stopping and not self._flush):
                break
            if not self._batches:
                await self._writer.send({"type": "websocket.send", "text": text})
                continue
            # What else waits goes in the same write: an upstream read's events, and those of
            # the other lanes.
            texts = [text]
            while len(texts) < MAX_BATCH_MESSAGES:
                try:
                    texts.append(self._outbound_receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            await self._writer.send({"type": "websocket.send", "texts": texts})
        if self._close is not None:
            await self._writer.close(self._outbound_receive, self._close, flush=self._flush)

    # --- reading ------------------------------------------------------------------------
    async def _read(self, receive: Receive) -> None:
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                return
            if kind == "websocket.receive":
                self._last_activity = trio.current_time()
                await self._on_message(message.get("text"), message.get("bytes"))

    async def _on_message(self, text: str | None, data: bytes | None) -> None:
        if self._stopping:
            return
        if text is None:
            self._say(error_event(InvalidMessage("send JSON as text messages, not binary")))
            return
        raw = text.encode()
        limit = self._settings.max_message_bytes
        if len(raw) > limit:
            reason = f"message of {len(raw)} bytes is over the limit of {limit}"
            self._stop(CLIENT_GONE, CloseFrame(code=CLOSE_TOO_BIG, reason=reason))
            return
        try:
            # A big message is read as a big body is, off the loop; the next waits for it.
            parsed = await off_loop(len(raw), partial(parse_client_message, raw))
        except MessageRefused as exc:
            self._say(error_event(exc))
            return
        if isinstance(parsed, SteerMessage):
            self._steer(parsed)
        else:
            self._submit(parsed)

    def _submit(self, create: CreateMessage) -> None:
        lane = create.stream_id
        if self._ending is not None:
            self._say(error_event(self._ending_error(), stream_id=lane, sequence_number=0))
            return
        verdict = self._lanes.submit(lane, create, create.size)
        if verdict is Verdict.START:
            assert self._lanes_nursery is not None
            self._lanes_nursery.start_soon(self._lane, lane, create)
            self._changed.set()
        elif verdict is not Verdict.QUEUED:
            settings = self._settings
            message = (
                f"{settings.max_lanes} lanes are answering on this socket "
                "([websocket.responses] max_lanes); wait for one to finish"
                if verdict is Verdict.TOO_MANY_LANES
                else f"the responses waiting on this socket hold {settings.max_queued_bytes} "
                "bytes ([websocket.responses] max_queued_bytes); wait for an answer to end"
            )
            self._refuse(create, TooManyRequests(message))

    def _refuse(self, create: CreateMessage, error: MessageRefused) -> None:
        """A create refused by the socket's bounds: a request refused before it began, with its
        record and access line."""
        session = self._session
        context = new_context(session, session.new_request_id())
        session.router.metrics.responses_socket_creates.labels("refused").inc()
        with request_context(context):
            record_refusal(session, context, error.code, time.time(), 0.0)
            log_access(context, 0.0)
        end_span(context)
        self._say(error_event(error, stream_id=create.stream_id, sequence_number=0))

    def _steer(self, steer: SteerMessage) -> None:
        """The gateway does not steer: the input goes back (``response.steer.failed``), on the
        lane of the response it names, numbered in that response's stream while it runs."""
        target = steer.previous_response_id
        lane = self._recent.get(target)
        turn = self._answering.get(lane) if target in self._recent else None
        writer = turn.writer if turn is not None else None
        running = writer is not None and writer.id == target
        sequence = writer.take_sequence_number() if writer is not None and running else 0
        self._say(steer_failed_event(steer, stream_id=lane, sequence_number=sequence))

    def _note_response(self, lane: Lane, response_id: str) -> None:
        self._recent[response_id] = lane
        while len(self._recent) > RECENT_RESPONSES:
            self._recent.popitem(last=False)

    async def _lane(self, lane: Lane, create: CreateMessage | None) -> None:
        """One lane while it answers: its creates, one after the other."""
        session = self._session
        while create is not None:
            turn = TurnCancel(new_context(session, session.new_request_id()))
            turn.on_response = partial(self._note_response, lane)
            self._answering[lane] = turn
            try:
                await serve_create(session, create, turn)
            finally:
                del self._answering[lane]
            create = self._lanes.finish(lane)
        # Idle is counted from the last message or the last answer, whichever is later.
        self._last_activity = trio.current_time()
        self._changed.set()
