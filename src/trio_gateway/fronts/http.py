"""Small ASGI helpers shared by the HTTP fronts."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from trio_gateway.errors import BodyTooLarge, GatewayError
from trio_gateway.fronts.openai_chunks import dumps

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
            "headers": [*JSON_HEADERS, (b"content-length", str(len(payload)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def send_error(
    send: Send, error: GatewayError, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send_json(send, error.status, error.to_body(), [*error.headers(), *(headers or [])])


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None
