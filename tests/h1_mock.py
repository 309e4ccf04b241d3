"""An upstream in memory for the HTTP/1.1 client: an ``httpx.MockTransport``-style handler
(``httpx.Request`` → ``httpx.Response``) behind a ``trio.abc.Stream``.

The handler runs inside the client's read, so its ``trio.sleep``s meet the client's own
deadlines exactly as a slow server would. Its response goes out chunked, one chunk per piece
of its body stream, pulled as the client reads: a body that stalls stalls the read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import httpx
import trio

from trio_gateway.http1.client import Origin

Handler = Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]


class HandlerStream(trio.abc.Stream):
    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._request = b""
        self._out = b""
        self._body: AsyncIterator[bytes] | None = None
        self._closed = False

    def _complete_request(self) -> httpx.Request | None:
        head, sep, body = self._request.partition(b"\r\n\r\n")
        if not sep:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            name, _, value = line.partition(": ")
            headers.append((name, value))
        length = int(next(v for k, v in headers if k.lower() == "content-length"))
        if len(body) < length:
            return None
        self._request = body[length:]
        host = next(v for k, v in headers if k.lower() == "host")
        return httpx.Request(method, f"http://{host}{target}", headers=headers, content=body)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError
        self._request += bytes(data)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError
        while not self._out:
            if self._body is None:
                request = self._complete_request()
                if request is None:
                    return b""  # nothing asked: the "server" hangs up
                await self._respond(request)
                continue
            try:
                piece = await self._body.__anext__()
            except StopAsyncIteration:
                self._body = None
                return b"0\r\n\r\n"
            if piece:
                self._out = b"%x\r\n%s\r\n" % (len(piece), piece)
        out, self._out = self._out, b""
        return out

    async def _respond(self, request: httpx.Request) -> None:
        response = await self._handler(request)
        lines = [f"HTTP/1.1 {response.status_code} {response.reason_phrase}"]
        for name, value in response.headers.items():
            if name.lower() not in ("content-length", "transfer-encoding"):
                lines.append(f"{name}: {value}")
        lines.append("transfer-encoding: chunked")
        self._out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        stream: Any = response.stream
        self._body = stream.__aiter__()

    async def aclose(self) -> None:
        self._closed = True
        await trio.lowlevel.checkpoint()


def handler_connect(handler: Handler) -> Callable[[Origin], Awaitable[trio.abc.Stream]]:
    """For ``H1Pool(connect=...)`` / ``Upstream(connect=...)``: every connection is served
    by ``handler``."""

    async def connect(origin: Origin) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        return HandlerStream(handler)

    return connect
