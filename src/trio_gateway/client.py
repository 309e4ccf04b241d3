"""A trio client for the gateway's WebSocket event stream (``/v1/ws``, docs/client.md)::

    async with connect("ws://127.0.0.1:8080/v1/ws", api_key=key) as gw:
        async for event in gw.stream("agent-lite", [{"role": "user", "content": "hi"}]):
            if isinstance(event, TextDelta):
                print(event.text, end="")

Many streams may run at once on one connection (one task each). Leaving a stream's loop early
(``break``, an exception) or cancelling the scope around it sends ``cancel`` for that request
only; the connection and the other streams go on. The events are the vocabulary of
docs/events.md as frozen attrs classes.

::

    connect()'s nursery
    ├── reader:    websocket → decode → the stream the event names (answers the gateway's pings)
    ├── writer:    outbound queue → websocket (the only task that writes)
    └── keepalive: a protocol ping every ping_interval_s; no pong in ping_timeout_s → close
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import attrs
import trio
import trio_websocket

from trio_gateway.core.events_codec import CLOSE_KEEPALIVE_TIMEOUT, TERMINAL_TYPES, VERSION

log = logging.getLogger("trio_gateway.client")

__all__ = [
    "Error",
    "Event",
    "Gateway",
    "GatewayClosed",
    "HandshakeRejected",
    "ProtocolError",
    "ReasoningDelta",
    "ReasoningDetail",
    "ResponseCancelled",
    "ResponseDone",
    "ResponseStarted",
    "ResponseStream",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallDone",
    "Usage",
    "connect",
    "decode_event",
]

# Events held per stream before the reader waits for that stream's consumer.
STREAM_BUFFER_EVENTS = 256
OUTBOUND_QUEUE_MESSAGES = 64
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # 16 MiB: a whole tool call's arguments fit in one event
CLOSE_TIMEOUT_S = 5.0
CLOSE_PROTOCOL_ERROR = 1002


# --- The vocabulary, typed ------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class _Envelope:
    id: str | None  # this client's name for the request ("r1", ...)
    request_id: str | None  # the gateway's (logs, metrics); null when a message was refused
    seq: int  # 0, 1, 2, ... per request


@attrs.frozen(kw_only=True)
class ResponseStarted(_Envelope):
    alias: str
    provider: str


@attrs.frozen(kw_only=True)
class ReasoningDelta(_Envelope):
    text: str


@attrs.frozen(kw_only=True)
class ReasoningDetail(_Envelope):
    """What the vendor needs back to go on thinking: one ``reasoning_details`` entry
    (docs/api.md), to append to the assistant message sent back."""

    detail: dict[str, Any]


@attrs.frozen(kw_only=True)
class TextDelta(_Envelope):
    text: str


@attrs.frozen(kw_only=True)
class ToolCallDelta(_Envelope):
    index: int
    call_id: str | None
    name: str | None
    arguments_delta: str


@attrs.frozen(kw_only=True)
class ToolCallDone(_Envelope):
    index: int
    call_id: str
    name: str
    arguments: Any  # parsed JSON when arguments_valid, else the raw string
    arguments_valid: bool


@attrs.frozen(kw_only=True)
class Usage(_Envelope):
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None
    cached_tokens: int | None


@attrs.frozen(kw_only=True)
class ResponseDone(_Envelope):
    finish_reason: str


@attrs.frozen(kw_only=True)
class ResponseCancelled(_Envelope):
    reason: str


@attrs.frozen(kw_only=True)
class Error(_Envelope):
    code: str
    message: str
    retryable: bool
    retry_after_s: float | None
    provider: str | None
    param: str | None


Event = (
    ResponseStarted
    | ReasoningDelta
    | ReasoningDetail
    | TextDelta
    | ToolCallDelta
    | ToolCallDone
    | Usage
    | ResponseDone
    | ResponseCancelled
    | Error
)

_EVENT_TYPES: Mapping[str, type[Event]] = {
    "response.started": ResponseStarted,
    "reasoning.delta": ReasoningDelta,
    "reasoning.detail": ReasoningDetail,
    "text.delta": TextDelta,
    "tool_call.delta": ToolCallDelta,
    "tool_call.done": ToolCallDone,
    "usage": Usage,
    "response.done": ResponseDone,
    "response.cancelled": ResponseCancelled,
    "error": Error,
}


class ProtocolError(Exception):
    """The gateway sent something this client cannot read."""


class HandshakeRejected(Exception):
    """The gateway refused the WebSocket before it opened: ``status_code`` is the HTTP status
    (401 ``invalid_api_key``, 400 ``invalid_request``, 403 too many sockets, ...), ``code`` and
    ``message`` the gateway's error (docs/api.md). An answer without an error body (the 403 of
    a gateway at ``max_sockets``) has ``code`` None and a message saying the status."""

    def __init__(self, status_code: int, code: str | None, message: str) -> None:
        super().__init__(
            f"{status_code} {code}: {message}" if code else f"{status_code}: {message}"
        )
        self.status_code = status_code
        self.code = code
        self.message = message


def _rejected(exc: trio_websocket.ConnectionRejected) -> HandshakeRejected:
    """trio-websocket's rejection, read as the gateway's error body (``{"error": {...}}``)."""
    status = exc.status_code
    try:
        error = json.loads(exc.body or b"")["error"]
        code, message = error["code"], error["message"]
    except (ValueError, TypeError, KeyError):
        code = message = None
    if isinstance(code, str) and isinstance(message, str):
        return HandshakeRejected(status, code, message)
    return HandshakeRejected(status, None, f"the gateway refused the WebSocket (HTTP {status})")


class GatewayClosed(Exception):
    """The connection ended while a stream was open. ``code`` is the WebSocket close code
    (4001 slow consumer, 4002 keepalive timeout, 1006 connection lost, ...)."""

    def __init__(self, code: int, reason: str | None) -> None:
        super().__init__(f"gateway connection closed: {code} {reason or ''}".rstrip())
        self.code = code
        self.reason = reason


def _parse(text: str | bytes) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except ValueError:
        raise ProtocolError(f"the gateway sent a message that is not JSON: {text!r:.80}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("the gateway sent a message that is not a JSON object")
    return obj


def decode_event(obj: Mapping[str, Any]) -> Event | None:
    """One wire event → its typed form; ``None`` for a type this client does not know (a newer
    gateway may add types within version 1; fields it adds are ignored too)."""
    if obj.get("v") != VERSION:
        raise ProtocolError(f"unsupported event version {obj.get('v')!r}")
    cls = _EVENT_TYPES.get(obj.get("type", ""))
    if cls is None:
        return None
    names = [field.name for field in attrs.fields(cls)]
    try:
        return cls(**{name: obj[name] for name in names})
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed {obj.get('type')} event: {exc}") from None


# --- One request's events -------------------------------------------------------------------


class ResponseStream:
    """The events of one request, ending with ``ResponseDone``, ``ResponseCancelled`` or
    ``Error``. The request is sent on the first iteration.

    Leaving early cancels the request: at once when iteration is cancelled or fails, or when the
    stream is closed (``async with``, :meth:`aclose`), and otherwise as soon as the object is
    dropped (right after ``break`` in CPython).
    """

    def __init__(self, gateway: Gateway, id: str, body: dict[str, Any]) -> None:
        self.id = id
        self._gateway = gateway
        self._body = body
        self._send, self._receive = trio.open_memory_channel[Event](gateway.stream_buffer_events)
        self._state = "new"  # → "open" (request sent) → "ended"

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> Event:
        if self._state == "ended":
            raise StopAsyncIteration
        if self._state == "new":
            await self._gateway._open(self.id, self._body, self._send)
            self._state = "open"
        try:
            event = await self._receive.receive()
        except trio.EndOfChannel:
            self._state = "ended"
            raise self._gateway._closed_error() from None
        except BaseException:
            self._abandon()
            raise
        if isinstance(event, ResponseDone | ResponseCancelled | Error):
            self._state = "ended"
        return event

    async def __aenter__(self) -> ResponseStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._abandon()

    async def aclose(self) -> None:
        """Stop: cancel the request if it is still running."""
        self._abandon()

    def _abandon(self) -> None:
        state, self._state = self._state, "ended"
        self._receive.close()
        if state == "open":
            self._gateway._cancel(self.id)

    def __del__(self) -> None:
        if getattr(self, "_state", "ended") != "ended":
            # Finalised outside the trio run (interpreter exit): nobody is left to tell.
            with contextlib.suppress(Exception):
                self._abandon()


# --- The connection -------------------------------------------------------------------------


class Gateway:
    """One WebSocket to the gateway. Made by :func:`connect`."""

    def __init__(
        self,
        ws: trio_websocket.WebSocketConnection,
        nursery: trio.Nursery,
        *,
        stream_buffer_events: int,
    ) -> None:
        self.stream_buffer_events = stream_buffer_events
        self._ws = ws
        self._nursery = nursery
        self._outbound_send, self._outbound_receive = trio.open_memory_channel[str](
            OUTBOUND_QUEUE_MESSAGES
        )
        self._routes: dict[str, trio.MemorySendChannel[Event]] = {}
        # Messages queued and not yet written, so that leaving connect() can let the cancels
        # of streams already left go out before the socket closes.
        self._unsent = 0
        self._written = trio.Event()  # set and replaced after each write, and at the writer's end
        self._writer_done = False
        self._next_id = 0
        # Why the connection ended, raised by every stream still open and every new one.
        self._closed: GatewayClosed | ProtocolError | None = None

    def stream(self, model: str, messages: list[dict[str, Any]], **fields: Any) -> ResponseStream:
        """A chat request to the alias ``model``; ``fields`` are any other body fields
        (``tools``, ``max_tokens``, ``reasoning``, ...)."""
        self._next_id += 1
        body = {"model": model, "messages": messages, **fields}
        return ResponseStream(self, f"r{self._next_id}", body)

    def _closed_error(self) -> GatewayClosed | ProtocolError:
        # A fresh exception per raise: one instance raised by many streams piles up tracebacks.
        closed = self._closed
        if isinstance(closed, ProtocolError):
            return ProtocolError(*closed.args)
        if isinstance(closed, GatewayClosed):
            return GatewayClosed(closed.code, closed.reason)
        return GatewayClosed(1006, "connection lost")

    async def _open(
        self, id: str, body: dict[str, Any], route: trio.MemorySendChannel[Event]
    ) -> None:
        if self._closed is not None:
            raise self._closed_error()
        # type and id first: the gateway can name the id even of a message too large to parse.
        message = json.dumps({"type": "request", "id": id, "body": body}, ensure_ascii=False)
        self._routes[id] = route
        self._unsent += 1
        try:
            await self._outbound_send.send(message)
        except BaseException:
            self._unsent -= 1
            self._routes.pop(id, None)
            raise

    def _cancel(self, id: str) -> None:
        """Synchronous, so that a stream being dropped can call it."""
        route = self._routes.pop(id, None)
        if route is not None:
            route.close()
        if self._closed is None:
            self._post({"type": "cancel", "id": id})

    def _post(self, message: dict[str, Any]) -> None:
        text = json.dumps(message)
        self._unsent += 1
        try:
            self._outbound_send.send_nowait(text)
        except trio.WouldBlock:
            # Never dropped: one waiting task per message, and there is at most one cancel per
            # stream. A closed nursery means the connection is gone: nobody to tell.
            with contextlib.suppress(RuntimeError):
                self._nursery.start_soon(self._outbound_send.send, text)
        except trio.ClosedResourceError:
            self._unsent -= 1

    def _connection_closed(self, error: GatewayClosed | ProtocolError) -> None:
        if self._closed is None:
            self._closed = error
        for route in self._routes.values():
            route.close()
        self._routes.clear()

    async def _read(self) -> None:
        while True:
            try:
                text = await self._ws.get_message()
            except trio_websocket.ConnectionClosed as exc:
                reason = exc.reason
                code = reason.code if reason is not None else 1006
                self._connection_closed(
                    GatewayClosed(code, reason.reason if reason is not None else None)
                )
                return
            try:
                obj = _parse(text)
                event = decode_event(obj)
            except ProtocolError as exc:
                # Nothing later on this connection can be trusted: end it, and every stream
                # on it raises this error.
                self._connection_closed(exc)
                with trio.move_on_after(CLOSE_TIMEOUT_S):
                    await self._ws.aclose(CLOSE_PROTOCOL_ERROR, "unreadable message")
                return
            kind = obj.get("type")
            if kind == "ping":
                self._post({"type": "pong"})
                continue
            if event is None:  # a pong, or a type this client does not know
                continue
            route_id = event.id or ""
            route = self._routes.get(route_id)
            if route is None:
                # A stream already left, or a refusal of a message this client never sent.
                log.debug("event for no open stream: %s", obj)
                continue
            if kind in TERMINAL_TYPES:
                del self._routes[route_id]
            # Waits while that stream's consumer is behind: the gateway then sees a slow reader.
            # Broken or closed: the stream was left meanwhile.
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await route.send(event)

    async def _write(self) -> None:
        try:
            async for text in self._outbound_receive:
                try:
                    await self._ws.send_message(text)
                except trio_websocket.ConnectionClosed:
                    return
                self._unsent -= 1
                self._wrote()
        finally:
            self._writer_done = True
            self._wrote()

    def _wrote(self) -> None:
        self._written.set()
        self._written = trio.Event()

    async def _flush(self) -> None:
        """Until every message queued so far is written, or nothing more can be."""
        while self._unsent > 0 and not self._writer_done:
            await self._written.wait()

    async def _keepalive(self, interval_s: float, timeout_s: float) -> None:
        """The gateway's own pings prove to it that we read; these prove to us that it lives
        (hypercorn answers protocol pings itself)."""
        while True:
            await trio.sleep(interval_s)
            try:
                with trio.fail_after(timeout_s):
                    await self._ws.ping()
            except trio_websocket.ConnectionClosed:
                return
            except trio.TooSlowError:
                reason = f"keepalive: no pong from the gateway within {timeout_s:g} s"
                self._connection_closed(GatewayClosed(CLOSE_KEEPALIVE_TIMEOUT, reason))
                with trio.move_on_after(timeout_s):
                    await self._ws.aclose(CLOSE_KEEPALIVE_TIMEOUT, reason)
                return


@asynccontextmanager
async def connect(
    url: str,
    *,
    api_key: str | None = None,
    ping_interval_s: float = 20.0,
    ping_timeout_s: float = 20.0,
    stream_buffer_events: int = STREAM_BUFFER_EVENTS,
    connect_timeout_s: float = 10.0,
) -> AsyncIterator[Gateway]:
    """Open a connection to ``ws://HOST:PORT/v1/ws``; closed (and its requests cancelled by
    the gateway) when the block ends. A refused handshake raises :class:`HandshakeRejected`."""
    headers = [] if api_key is None else [(b"authorization", f"Bearer {api_key}".encode())]
    async with contextlib.AsyncExitStack() as stack:
        opening = trio_websocket.open_websocket_url(
            url,
            extra_headers=headers,
            max_message_size=MAX_MESSAGE_BYTES,
            connect_timeout=connect_timeout_s,
            disconnect_timeout=ping_timeout_s,
        )
        try:
            ws = await stack.enter_async_context(opening)
        except trio_websocket.ConnectionRejected as exc:
            raise _rejected(exc) from exc
        nursery = await stack.enter_async_context(trio.open_nursery())
        gateway = Gateway(ws, nursery, stream_buffer_events=stream_buffer_events)
        nursery.start_soon(gateway._read)
        nursery.start_soon(gateway._write)
        nursery.start_soon(gateway._keepalive, ping_interval_s, ping_timeout_s)
        try:
            yield gateway
        finally:
            # The cancels of streams left in the block go out before the socket closes: the
            # gateway would otherwise see a client that vanished (client_gone), not a cancel.
            with trio.move_on_after(CLOSE_TIMEOUT_S) as flushing:
                flushing.shield = True
                await gateway._flush()
            nursery.cancel_scope.cancel()
