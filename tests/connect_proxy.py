"""A small HTTP proxy for tests: CONNECT tunnels and absolute-form requests in the clear,
each recorded (the request line and its Proxy-Authorization), on a real socket; and a TLS
front that puts a plain server (the simulator) behind a certificate of a private CA."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import attrs
import trio


@attrs.define
class Seen:
    lines: list[str] = attrs.Factory(list)
    authorizations: list[str | None] = attrs.Factory(list)


async def _pipe(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
        if isinstance(sink, trio.abc.HalfCloseableStream):
            await sink.send_eof()
        else:
            await trio.aclose_forcefully(sink)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _handle(seen: Seen, refuse: bool, client: trio.SocketStream) -> None:
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            data = await client.receive_some(65536)
            if not data:
                return
            head += data
    except trio.BrokenResourceError:
        return
    head, _, rest = head.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    seen.lines.append(lines[0])
    fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    seen.authorizations.append(fields.get("proxy-authorization"))
    method, target, _ = lines[0].split(" ")
    if refuse:
        await client.send_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
        await client.aclose()
        return
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        upstream = await trio.open_tcp_stream(host.strip("[]"), int(port))
        await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
    else:
        # The absolute form: forward the request as it came, in origin form.
        authority = target.split("/", 3)[2]
        host, _, port = authority.rpartition(":")
        upstream = await trio.open_tcp_stream(host.strip("[]"), int(port or 80))
        path = "/" + target.split("/", 3)[3]
        kept = [x for x in lines[1:] if not x.lower().startswith("proxy-authorization")]
        rest = "\r\n".join([f"{method} {path} HTTP/1.1", *kept]).encode() + b"\r\n\r\n" + rest
        await upstream.send_all(rest)
        rest = b""
    if rest:
        await upstream.send_all(rest)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_pipe, client, upstream)
        nursery.start_soon(_pipe, upstream, client)


@asynccontextmanager
async def connect_proxy(*, refuse: bool = False) -> AsyncIterator[tuple[str, Seen]]:
    """``http://127.0.0.1:PORT`` and what it has seen; ``refuse``: 403 to everything."""
    seen = Seen()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, partial(_handle, seen, refuse), 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}", seen
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def tls_front(context: ssl.SSLContext, port: int) -> AsyncIterator[str]:
    """``https://localhost:PORT``: TLS ended here, the bytes relayed to 127.0.0.1:``port``."""

    async def relay(client: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            await client.do_handshake()
        except trio.BrokenResourceError:
            return  # a client that refused the certificate
        upstream = await trio.open_tcp_stream("127.0.0.1", port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pipe, client, upstream)
            nursery.start_soon(_pipe, upstream, client)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_ssl_over_tcp, relay, 0, context, host="127.0.0.1")
        )
        front_port = listeners[0].transport_listener.socket.getsockname()[1]
        yield f"https://localhost:{front_port}"
        nursery.cancel_scope.cancel()
