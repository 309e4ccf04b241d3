"""Small ASGI helpers shared by the HTTP fronts."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import trio

from trio_gateway.core.errors import (
    BodyTooLarge,
    GatewayError,
    InternalError,
    MalformedHttp,
    RequestTimeout,
)
from trio_gateway.core.events_codec import is_terminal
from trio_gateway.dispatch.relay import CLIENT_STALL, ClientLeft, DropConnection, Item, Outcome
from trio_gateway.fronts.direct import ClientSocket, DirectBody
from trio_gateway.fronts.openai_chunks import dumps
from trio_gateway.http1.errors import H1Error, body_too_large
from trio_gateway.ops.access import current as current_request

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("trio_gateway")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    # nginx buffers proxied responses unless told not to.
    (b"x-accel-buffering", b"no"),
]
JSON_HEADERS = [(b"content-type", b"application/json")]


class ClientGone(Exception):
    """The client left before its request body arrived."""


# The body limit as the gateway's config names it, for the 413's message.
MAX_BODY_BYTES_KEY = "server.max_body_bytes"


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, refusing (413) as soon as it passes ``limit`` bytes. Where the
    HTTP/1.x server finds the body malformed or too slow, its error becomes the gateway's here."""
    parts: list[bytes] = []
    size = 0
    while True:
        try:
            message = await receive()
        except H1Error as exc:
            if exc.status == 408:
                raise RequestTimeout(exc.message) from None
            if exc.status == 413:
                raise BodyTooLarge(exc.message) from None
            raise MalformedHttp(exc.message) from None
        if message["type"] == "http.disconnect":
            raise ClientGone()
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise BodyTooLarge(body_too_large(MAX_BODY_BYTES_KEY, limit))
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


def _started(status: int, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Once per response: the access line learns its status, and the request id is echoed on
    every answer (a front that names it already is left alone)."""
    context = current_request()
    if context is None:
        return headers
    context.status = status
    if any(name == b"x-request-id" for name, _ in headers):
        return headers
    return [*headers, (b"x-request-id", context.request_id.encode())]


async def send_json(
    send: Send,
    status: int,
    body: Any,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    payload = dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": _started(
                status,
                [*JSON_HEADERS, (b"content-length", str(len(payload)).encode()), *(headers or [])],
            ),
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def send_bytes(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": _started(status, headers)}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


# How a front words an error: its status and JSON body. The gateway's own (OpenAI's shape) by
# default; the vendor-shaped fronts (``/v1/messages``) word it as their vendor does.
ErrorShape = Callable[[GatewayError], tuple[int, Any]]


def openai_error(error: GatewayError) -> tuple[int, Any]:
    return error.status, error.to_body()


async def send_error(
    send: Send,
    error: GatewayError,
    headers: list[tuple[bytes, bytes]] | None = None,
    shape: ErrorShape = openai_error,
) -> None:
    status, body = shape(error)
    await send_json(send, status, body, [*error.headers(), *(headers or [])])


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


class SSEAnswer:
    """One SSE answer, as the relay's sink: the first item decides between an HTTP error and a
    200 stream; then each batch of items is rendered into one write, and ``closing()`` is
    appended at the end.

    ``answered`` is set as the answer's last event (its end, or the error that ends it) is
    handed to the kernel: from then on a hang-up cancels nothing, and only a write that fails
    means the client did not get its answer. The openai SDK (sync) closes the connection as
    soon as it reads ``[DONE]``, without the body's last chunk, while the gateway still reads
    the upstream's own end: 3 to 30 of 100 whole answers were recorded ``cancelled`` when this
    was set only before the body's last chunk.

    With ``client`` (the connection's socket, for HTTP/1.x) the body goes straight to it
    (``direct.py``): hypercorn writes only the head and the end. Otherwise (HTTP/2, or no socket
    known) every write goes through hypercorn, which cannot be interrupted: :meth:`watchdog`
    then drops a client whose write has been blocked for a whole stall period."""

    def __init__(
        self,
        send: Send,
        *,
        render: Callable[[Item], bytes],
        headers: list[tuple[bytes, bytes]],
        answered: trio.Event,
        stall_timeout_s: float,
        client: ClientSocket | None = None,
        drop: DropConnection | None = None,
        closing: Callable[[], bytes] = lambda: b"",
        extra_sse_headers: list[tuple[bytes, bytes]] | None = None,
        error_shape: ErrorShape = openai_error,
    ) -> None:
        self._send = send
        self._error_shape = error_shape
        self._render = render
        self._headers = headers
        self._answered = answered
        self._stall_timeout_s = stall_timeout_s
        self._client = client
        self._drop = drop
        self._closing = closing
        self._extra_sse_headers = extra_sse_headers or []
        self._direct: DirectBody | None = None
        self._started = False
        self._ended = False
        # For the watchdog: when the write in progress through hypercorn began.
        self._writing_since: float | None = None

    async def put(self, items: Sequence[Item]) -> None:
        if self._ended:
            return
        if not self._started:
            first = items[0]
            if isinstance(first, GatewayError):
                self._ended = True
                self._answered.set()
                await send_error(self._send, first, self._headers, self._error_shape)
                return
            await self._start()
        if is_terminal(items[-1]):
            # Before the write: a client that closes as soon as it has read these bytes can be
            # seen gone within the write itself (HangUps.tick); the write failing is what says
            # it did not get them (ClientLeft, a cancellation).
            self._answered.set()
        render = self._render
        data = render(items[0]) if len(items) == 1 else b"".join([render(i) for i in items])
        if self._direct is not None:
            await self._direct.write(data)
        elif data:
            await self._send_body(data, more=True)

    async def end(self) -> None:
        if not self._started:
            await self.put([InternalError("the answer ended before it began")])
        if self._ended:
            return
        self._ended = True
        tail = self._closing()
        direct = self._direct
        if direct is not None:
            try:
                await direct.write(tail)
                tail = b""
                # The server's write of the last chunk is not bounded: room for it first.
                await direct.wait_room()
            except ClientLeft:
                if not self._answered.is_set():
                    raise
                return  # it had the whole answer, and closed: its ordinary end
        self._answered.set()
        await self._send_body(tail, more=False)

    async def _start(self) -> None:
        self._started = True
        headers = [*SSE_HEADERS, *self._extra_sse_headers, *self._headers]
        await self._send(
            {"type": "http.response.start", "status": 200, "headers": _started(200, headers)}
        )
        if self._client is not None:
            self._direct = self._client.body(self._stall_timeout_s)

    async def _send_body(self, data: bytes, *, more: bool) -> None:
        self._writing_since = trio.current_time()
        await self._send({"type": "http.response.body", "body": data, "more_body": more})
        self._writing_since = None

    async def watchdog(self, scope: trio.CancelScope, outcome: Outcome) -> None:
        """Without the socket, a client that stopped reading blocks hypercorn's write for good:
        a write still in progress a stall period after it began drops the connection (which
        fails the write), checked once a period (so within two)."""
        period_s = self._stall_timeout_s
        while True:
            await trio.sleep(period_s)
            since = self._writing_since
            if since is not None and trio.current_time() - since >= period_s:
                outcome.cancelled = outcome.cancelled or CLIENT_STALL
                scope.cancel(reason=CLIENT_STALL)
                if self._drop is not None:
                    self._drop()
                return
