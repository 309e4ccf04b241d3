"""A provider's side requests (httpx) leave the way its chat does: vLLM's /load through the
HTTP proxy the environment names, in the absolute form, direct when NO_PROXY says so."""

from __future__ import annotations

from functools import partial

import trio

from tests.connect_proxy import connect_proxy
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.providers.upstream import Upstream


async def serve_load(stream: trio.SocketStream) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    body = b'{"server_load": 3}'
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    await stream.send_all(head.encode() + body)
    await stream.aclose()


async def load_through(environ: dict[str, str], port: int) -> int | None:
    config = ProviderConfig(
        name="v",
        type="openai_compatible",
        model="m",
        base_url=f"http://127.0.0.1:{port}/v1",
        connect_timeout_s=5,
    )
    async with Upstream.make_client(config, environ=environ) as client:
        return await Upstream(config, None, client, environ=environ).read_load()


async def test_load_goes_through_the_http_proxy_and_no_proxy_bypasses_it() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve_load, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with connect_proxy() as (proxy, seen):
            assert await load_through({"http_proxy": proxy}, port) == 3
            assert seen.lines == [f"GET http://127.0.0.1:{port}/load HTTP/1.1"]
            direct = {"http_proxy": proxy, "no_proxy": "127.0.0.0/8"}
            assert await load_through(direct, port) == 3
            assert len(seen.lines) == 1
            # A proxy that cannot be spoken is a failed scrape, never a direct connection.
            assert await load_through({"http_proxy": "socks5://x"}, port) is None
        nursery.cancel_scope.cancel()
