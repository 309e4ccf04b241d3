"""Small ASGI helpers shared by the HTTP fronts."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from trio_gateway.access import current as current_request
from trio_gateway.errors import BodyTooLarge, GatewayError, InternalError
from trio_gateway.fronts.openai_chunks import dumps
from trio_gateway.relay import Item

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


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, refusing (413) as soon as it passes ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise BodyTooLarge(f"request body is larger than the limit of {limit} bytes")
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


async def send_error(
    send: Send, error: GatewayError, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send_json(send, error.status, error.to_body(), [*error.headers(), *(headers or [])])


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


async def stream_sse(
    channel: trio.MemoryReceiveChannel[Item],
    send: Send,
    *,
    render: Callable[[Item], bytes],
    headers: list[tuple[bytes, bytes]],
    answered: trio.Event,
    closing: Callable[[], bytes] = lambda: b"",
    extra_sse_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """One SSE answer: the first item decides between an HTTP error and a 200 stream; then
    every item rendered, what is already waiting joined into one write (fewer syscalls per
    token), ``closing()`` appended once the channel ends, and ``answered`` set just before the
    last write (hypercorn reports a disconnect after it too: that one is no cancellation)."""
    try:
        first = await channel.receive()
    except trio.EndOfChannel:
        first = InternalError("the answer ended before it began")
    if isinstance(first, GatewayError):
        answered.set()
        await send_error(send, first, headers)
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": _started(200, [*SSE_HEADERS, *(extra_sse_headers or []), *headers]),
        }
    )
    pending = [render(first)]
    ended = False
    while not ended:
        while True:
            try:
                pending.append(render(channel.receive_nowait()))
            except trio.WouldBlock:
                break
            except trio.EndOfChannel:
                ended = True
                break
        if not ended and not pending:
            try:
                pending.append(render(await channel.receive()))
            except trio.EndOfChannel:
                ended = True
        if ended:
            pending.append(closing())
        data = b"".join(pending)
        pending.clear()
        if data:
            await send({"type": "http.response.body", "body": data, "more_body": True})
    answered.set()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
