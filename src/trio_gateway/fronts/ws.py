"""``GET /v1/ws``: the event vocabulary over a WebSocket, many requests per socket.

::

    one socket (hypercorn's ASGI websocket scope)
    ├── writer:    outbound queue → websocket.send        the only task that writes
    ├── keepalive: {"type":"ping"} every ping_interval_s; no pong in ping_timeout_s → close 4002
    ├── reader:    websocket.receive → parse → start or cancel requests (the handler's own task)
    └── requests nursery
        └── one task per request: relay() → encoder → outbound queue

A request's events enter the outbound queue without waiting (``send_nowait``): a client that
stops reading fills it, and the socket is closed with 4001 and every request on it cancelled, so
one stalled reader never holds an upstream. Requests are cancelled through relay's ``watch``, so
each ``Outcome`` records why (``ws_cancel``, ``client_gone``, ``client_stall``).

hypercorn gives the app no way to send a protocol-level ping or to see a pong, hence the
keepalive is application-level. Close codes sent by a client reach us as 1006 (hypercorn #127);
nothing here depends on them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import attrs
import trio

from trio_gateway.accounting.key_store import KeyStore
from trio_gateway.config.schema import ServerConfig, WebSocketConfig
from trio_gateway.core.errors import (
    DuplicateId,
    GatewayError,
    InternalError,
    MessageRefused,
    TooManyRequests,
)
from trio_gateway.core.events import ResponseCancelled
from trio_gateway.core.events_codec import (
    CLOSE_GOING_AWAY,
    CLOSE_KEEPALIVE_TIMEOUT,
    CLOSE_SLOW_CONSUMER,
    PING,
    PONG,
    CancelMessage,
    EventEncoder,
    PingMessage,
    PongMessage,
    RequestMessage,
    dumps,
    is_terminal,
    parse_client_message,
    refusal,
)
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.request import ChatRequest, validate_chat_body
from trio_gateway.core.usage import refused_record
from trio_gateway.dispatch.relay import (
    CLIENT_GONE,
    CLIENT_STALL,
    DropConnection,
    Item,
    Outcome,
    relay,
)
from trio_gateway.dispatch.router import Plan, Router
from trio_gateway.fronts.auth import authorize, prioritize, websocket_handshake
from trio_gateway.fronts.chat import known_alias
from trio_gateway.fronts.http import JSON_HEADERS, Receive, Scope, Send
from trio_gateway.fronts.off_loop import off_loop
from trio_gateway.fronts.openai_chunks import dumps as json_bytes
from trio_gateway.ops.access import RequestContext, log_access, request_context
from trio_gateway.ops.drain import SHUTDOWN
from trio_gateway.ops.tracing import new_trace

log = logging.getLogger("trio_gateway")

WS_CANCEL = "ws_cancel"
# How a WebSocket request appears in the access log.
WS_ROUTE = "WS /v1/ws"


@attrs.frozen(kw_only=True)
class CloseFrame:
    code: int
    reason: str


@attrs.frozen(kw_only=True)
class WebSocketStats:
    open_sockets: int
    requests_in_flight: int


class SocketPlaces:
    """``[websocket] max_sockets``: the WebSockets open at once, on every WebSocket route
    (``/v1/ws``, and the Responses API's ``/v1/responses``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def take(self) -> bool:
        """A place for one more socket, taken at once (no other handshake may run between the
        check and the count, or concurrent handshakes all pass the check); False when full."""
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1


class SocketWriter:
    """A socket's writes through the ASGI ``send``, counted for :meth:`watch`: hypercorn writes
    shielded and without a timeout, so a client that stops reading blocks a write for good (or
    until the kernel's TCP_USER_TIMEOUT, where there is one). Shared by both WebSocket
    routes."""

    def __init__(self, send: Send, period_s: float) -> None:
        self._send = send
        self._period_s = period_s
        self._in_send = 0  # writes in progress (the Responses socket's lanes write side by side)
        self._sends = 0

    async def send(self, message: dict[str, Any]) -> None:
        self._in_send += 1
        try:
            await self._send(message)
        finally:
            self._in_send -= 1
            self._sends += 1

    async def watch(self, stuck: Callable[[], object]) -> None:
        """Calls ``stuck`` (which drops the connection, failing the write) once a write is
        still blocked a whole period after it was first seen: within one to two periods."""
        seen = -1
        while True:
            await trio.sleep(self._period_s)
            if self._in_send and self._sends == seen:
                stuck()
                return
            seen = self._sends

    async def close(
        self, queued: trio.MemoryReceiveChannel[str], close: CloseFrame, *, flush: bool
    ) -> None:
        """The close frame, after what is queued when ``flush`` (a graceful close: the last
        answers' final events must arrive); within one period."""
        with trio.move_on_after(self._period_s):
            while flush:
                try:
                    text = queued.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                await self.send({"type": "websocket.send", "text": text})
            await self.send({"type": "websocket.close", "code": close.code, "reason": close.reason})


class WebSocketFront:
    """Serves every socket on ``/v1/ws``; holds only counters across sockets."""

    def __init__(
        self,
        router: Router,
        server: ServerConfig,
        config: WebSocketConfig,
        new_request_id: Callable[[], str],
        keys: KeyStore | None = None,
        places: SocketPlaces | None = None,
    ) -> None:
        self.router = router
        self.keys = keys  # None: no API keys needed
        self.server = server
        self.config = config
        self.new_request_id = new_request_id
        self.places = places if places is not None else SocketPlaces(config.max_sockets)
        self._requests_in_flight = 0

    def statistics(self) -> WebSocketStats:
        return WebSocketStats(
            open_sockets=self.places.open, requests_in_flight=self._requests_in_flight
        )

    async def serve(
        self,
        receive: Receive,
        send: Send,
        drop_connection: DropConnection | None = None,
        scope: Scope | None = None,
    ) -> None:
        """One socket, from the handshake until it is closed by either side.

        ``drop_connection`` shuts the client's TCP connection: the way out for a writer
        blocked on a client that stopped reading. ``scope`` holds the upgrade's headers,
        subprotocols and query, where the API key is."""
        if (await receive())["type"] != "websocket.connect":
            return
        scope = scope if scope is not None else {}
        try:
            handshake = websocket_handshake(scope)
            key = None if self.keys is None else self.keys.authenticate(handshake.key)
        except GatewayError as exc:
            # Refused before the upgrade; the key is never logged.
            log.info("refusing a websocket: %s", exc.code)
            await refuse_upgrade(send, scope, exc)
            return
        # The place is taken before the accept is awaited (SocketPlaces.take).
        if not self.places.take():
            # Refused before the upgrade: the client sees HTTP 403 and can try another replica.
            log.warning("refusing a websocket: %d sockets open", self.places.open)
            await send({"type": "websocket.close", "code": 1013})
            return
        try:
            await send({"type": "websocket.accept", "subprotocol": handshake.subprotocol})
            await _Socket(self, send, drop_connection, key).run(receive)
        finally:
            self.places.release()


async def refuse_upgrade(send: Send, scope: Scope, error: GatewayError) -> None:
    """Refuse an upgrade with the error's HTTP status and JSON body where the server supports
    ASGI's denial responses (hypercorn does), else with a plain close (HTTP 403)."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    payload = json_bytes(error.to_body())
    headers = [*JSON_HEADERS, (b"content-length", str(len(payload)).encode()), *error.headers()]
    await send(
        {"type": "websocket.http.response.start", "status": error.status, "headers": headers}
    )
    await send({"type": "websocket.http.response.body", "body": payload, "more_body": False})


class _Request:
    """One request on a socket: its names and its cancel trigger."""

    def __init__(self, id: str, request_id: str) -> None:
        self.id = id
        self.request_id = request_id
        self.finished = False  # its terminal event is queued: a cancel now changes nothing
        self.cause: str | None = None
        self._trigger = trio.Event()

    def cancel(self, cause: str) -> None:
        if self.finished or self.cause is not None:
            return
        self.cause = cause
        self._trigger.set()

    async def watch(self, scope: trio.CancelScope, outcome: Outcome) -> None:
        await self._trigger.wait()
        outcome.cancelled = outcome.cancelled or self.cause
        scope.cancel(reason=self.cause)


class _Events:
    """One request's answer, as the relay's sink: each event queued for the socket's writer,
    at once (the queue's bound, not the request, deals with a client that reads slowly)."""

    def __init__(
        self,
        enqueue: Callable[[dict[str, Any]], None],
        encoder: EventEncoder,
        entry: _Request,
        finish: Callable[[], None],
    ) -> None:
        self._enqueue = enqueue
        self._encoder = encoder
        self._entry = entry
        self._finish = finish

    async def put(self, items: Sequence[Item]) -> None:
        for item in items:
            if self._entry.finished:
                return  # after the end; the producer stops on its own
            self._enqueue(self._encoder.encode(item))
            if is_terminal(item):
                self._finish()

    async def end(self) -> None:
        pass


class _Socket:
    def __init__(
        self,
        front: WebSocketFront,
        send: Send,
        drop_connection: DropConnection | None,
        key: ApiKey | None,
    ) -> None:
        self._front = front
        self._key = key  # the socket's API key; each request's alias is checked against it
        self._drop_connection = drop_connection
        self._config = front.config
        self._outbound_send, self._outbound_receive = trio.open_memory_channel[str](
            front.config.max_queued_events
        )
        self._requests: dict[str, _Request] = {}
        self._idle = trio.Event()  # set whenever no request is in flight
        self._idle.set()
        self._stopping = False
        self._flush = False
        self._close: CloseFrame | None = None
        self._pong = trio.Event()
        self._read_scope = trio.CancelScope()
        self._keepalive_scope = trio.CancelScope()
        self._drain_scope = trio.CancelScope()
        self._writer_idle: trio.CancelScope | None = None
        self._writer = SocketWriter(send, front.server.client_stall_timeout_s)
        self._watch_scope = trio.CancelScope()
        self._requests_nursery: trio.Nursery | None = None

    async def run(self, receive: Receive) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write)
            nursery.start_soon(self._watch_writes)
            nursery.start_soon(self._keepalive)
            nursery.start_soon(self._close_when_drained)
            async with trio.open_nursery() as requests:
                self._requests_nursery = requests
                with self._read_scope:
                    await self._read(receive)
                # The client left (or _stop already ran): nothing is left to serve.
                self._stop(CLIENT_GONE, None)
            # Every request has ended; the writer ends by itself after its last write.

    async def _close_when_drained(self) -> None:
        """A stopping gateway refuses new requests (``shutting_down``); once the socket's last
        answer has ended (within the drain), the socket closes with 1001."""
        with self._drain_scope:
            await self._front.router.drain.began.wait()
            while self._requests:
                await self._idle.wait()
            self._stop(
                SHUTDOWN,
                CloseFrame(code=CLOSE_GOING_AWAY, reason="gateway shutting down"),
                flush=True,
            )

    def _stop(self, cause: str, close: CloseFrame | None, *, flush: bool = False) -> None:
        """Begin closing the socket: cancel its requests, stop reading and pinging, and let
        the writer send ``close`` (if any) instead of what is still queued, or after it with
        ``flush`` (a graceful close: the last answers' final events must arrive)."""
        if self._stopping:
            return
        self._stopping = True
        self._close = close
        self._flush = flush
        if close is not None:
            log.info("closing a websocket: %d %s", close.code, close.reason)
        for request in self._requests.values():
            request.cancel(cause)
        self._read_scope.cancel()
        self._keepalive_scope.cancel()
        self._drain_scope.cancel()
        if self._writer_idle is not None:
            self._writer_idle.cancel()

    def _enqueue(self, message: dict[str, Any]) -> None:
        if self._stopping:
            return
        try:
            self._outbound_send.send_nowait(dumps(message))
        except trio.WouldBlock:
            limit = self._config.max_queued_events
            self._stop(
                CLIENT_STALL,
                CloseFrame(
                    code=CLOSE_SLOW_CONSUMER,
                    reason=f"slow consumer: more than {limit} events waiting to be sent",
                ),
            )

    async def _watch_writes(self) -> None:
        """A write blocked for a stall period drops the connection (``SocketWriter.watch``),
        which fails the write and lets the socket end."""
        with self._watch_scope:
            await self._writer.watch(self._stuck)

    def _stuck(self) -> None:
        log.info("dropping a websocket whose client stopped reading")
        self._stop(CLIENT_STALL, None)
        if self._drop_connection is not None:
            self._drop_connection()

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
            # A message handed over just before _stop cancelled the wait is still ours to write
            # when the close is graceful.
            if text is None or (self._stopping and not self._flush):
                break
            # hypercorn writes without a timeout; a client that stops reading blocks here until
            # _watch_writes drops the connection. Requests are not waiting on this: they queue,
            # and the queue's bound closes the socket.
            await self._writer.send({"type": "websocket.send", "text": text})
        if self._close is not None:
            await self._writer.close(self._outbound_receive, self._close, flush=self._flush)

    async def _keepalive(self) -> None:
        interval_s = self._config.ping_interval_s
        timeout_s = self._config.ping_timeout_s
        with self._keepalive_scope:
            while True:
                await trio.sleep(interval_s)
                self._pong = trio.Event()
                self._enqueue(PING)
                with trio.move_on_after(timeout_s) as waiting:
                    await self._pong.wait()
                if waiting.cancelled_caught:
                    self._stop(
                        CLIENT_GONE,
                        CloseFrame(
                            code=CLOSE_KEEPALIVE_TIMEOUT,
                            reason=f"keepalive: no pong within {timeout_s:g} s",
                        ),
                    )
                    return

    async def _read(self, receive: Receive) -> None:
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                return
            if kind == "websocket.receive":
                text = message.get("text")
                await self._on_message(text if text is not None else message.get("bytes") or b"")

    async def _on_message(self, data: str | bytes) -> None:
        """One message; a big one read (and its request checked) off the loop, while the
        socket's next message waits (``fronts/off_loop.py``)."""
        if self._stopping:
            return  # a message received just as the socket began to close: nothing may start
        read = partial(parse_client_message, data, max_bytes=self._config.max_message_bytes)
        try:
            parsed = await off_loop(len(data), read)
        except MessageRefused as exc:
            self._enqueue(refusal(exc))
            return
        if isinstance(parsed, RequestMessage):
            await self._start(parsed, len(data))
        elif isinstance(parsed, CancelMessage):
            # Unknown or finished ids are ignored: a cancel may cross the answer's last event.
            request = self._requests.get(parsed.id)
            if request is not None:
                request.cancel(WS_CANCEL)
        elif isinstance(parsed, PingMessage):
            self._enqueue(PONG)
        elif isinstance(parsed, PongMessage):
            self._pong.set()

    async def _start(self, message: RequestMessage, size: int) -> None:
        if message.id in self._requests:
            self._enqueue(
                refusal(
                    DuplicateId(
                        f"a request with id {message.id!r} is still in flight on this socket",
                        message_id=message.id,
                    )
                )
            )
            return
        alias = known_alias(self._front.router, message.body)
        limit = self._config.max_requests_per_socket
        if len(self._requests) >= limit:
            self._refused(self._front.new_request_id(), TooManyRequests.code, alias)
            self._enqueue(
                refusal(
                    TooManyRequests(
                        f"{limit} requests are already in flight on this socket",
                        message_id=message.id,
                    )
                )
            )
            return
        request_id = self._front.new_request_id()
        try:
            request = await off_loop(size, partial(self._read_request, message.body))
            plan = self._front.router.plan(request)
        except GatewayError as exc:
            self._refused(request_id, exc.code, alias)
            encoder = EventEncoder(request_id=request_id, alias=None, id=message.id)
            self._enqueue(encoder.encode(exc))
            return
        entry = _Request(message.id, request_id)
        self._requests[message.id] = entry
        if self._idle.is_set():  # a waiter on the unset one must still be woken by it
            self._idle = trio.Event()
        assert self._requests_nursery is not None
        self._requests_nursery.start_soon(self._serve_request, entry, request, plan)

    def _read_request(self, body: dict[str, Any]) -> ChatRequest:
        """A request message's body as the request the socket's key may make, screened by
        its alias's input filters."""
        router = self._front.router
        request = authorize(validate_chat_body(body), self._key)
        request = prioritize(request, self._key, router.aliases)
        router.screen(request)
        return request

    def _refused(self, request_id: str, code: str, alias: str | None) -> None:
        """A request refused before its relay began (which records the others); ``alias`` is
        the configured alias its body named, if any (chat.known_alias)."""
        record = refused_record(
            request_id=request_id,
            key=None if self._key is None else self._key.name,
            alias=alias,
            error_code=code,
            started_at=time.time(),
        )
        self._front.router.usage.offer(record)
        self._front.router.metrics.requests.labels("", "", record.outcome, code).inc()
        context = self._context(request_id)
        context.record(record)
        # Inside the request's context, so that the line's [request id] is its own.
        with request_context(context):
            log_access(context, 0.0)
        if context.span is not None:
            context.span.end(None, alias)

    def _context(self, request_id: str) -> RequestContext:
        """A request's context, with its span when tracing is on (a new trace: the messages
        of a socket carry no traceparent)."""
        tracing = self._front.router.tracing
        if tracing is None:
            return RequestContext(request_id=request_id, route=WS_ROUTE, trace=new_trace())
        span, trace = tracing.start(WS_ROUTE, None, None)
        return RequestContext(request_id=request_id, route=WS_ROUTE, trace=trace, span=span)

    async def _serve_request(self, entry: _Request, request: ChatRequest, plan: Plan) -> None:
        server = self._front.server
        encoder = EventEncoder(request_id=entry.request_id, alias=request.alias, id=entry.id)

        def finish() -> None:
            entry.finished = True
            self._requests.pop(entry.id, None)
            if not self._requests:
                self._idle.set()

        sink = _Events(self._enqueue, encoder, entry, finish)

        try:
            # Budgets and rate limits: awaited here, in the request's own task, not in dispatch.
            admission = await self._front.router.admit(self._key, request, plan)
        except GatewayError as exc:
            finish()
            self._refused(entry.request_id, exc.code, request.alias)
            self._enqueue(encoder.encode(exc))
            return
        self._front._requests_in_flight += 1
        outcome: Outcome | None = None
        context = self._context(entry.request_id)
        started = trio.current_time()
        with request_context(context):
            try:
                outcome = await relay(
                    request,
                    plan,
                    sink=sink,
                    client_stall_timeout_s=server.client_stall_timeout_s,
                    watch=[entry.watch],
                    request_id=entry.request_id,
                    admission=admission,
                )
            except Exception:
                log.exception("websocket request %s failed", entry.request_id)
            finally:
                self._front._requests_in_flight -= 1
                # In the request's context: the line's [request id] is the one its events carry.
                log_access(context, trio.current_time() - started)
                if context.span is not None:
                    context.span.end(None, request.alias)
        if entry.finished:
            return
        finish()
        if outcome is not None and outcome.cancelled is not None:
            self._enqueue(encoder.encode(ResponseCancelled(reason=outcome.cancelled)))
        else:
            self._enqueue(encoder.encode(InternalError("the answer ended early")))
