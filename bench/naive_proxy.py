"""The baseline: a pass-through proxy that does **not** propagate client disconnects.

trio + hypercorn + one pooled httpx client, as a first version of a gateway would be written:
read the request, send it upstream, copy the response bytes back as they come. It never calls
``receive()`` after the body, so it never sees ``http.disconnect``; and hypercorn neither cancels
the app nor fails ``send()`` when the client has gone (docs: upstream-facts section 5). A client
that leaves therefore does not close the upstream connection, and the upstream keeps generating
for nobody until the answer is complete. This is the "proxy without disconnect propagation" of
the cancellation experiment (upstream-facts section 4), and the requests/s baseline.

Nothing else is left out on purpose: no admission control (every request goes upstream at once),
no buffering beyond the stack's own, no parsing of the stream.

    python -m bench.naive_proxy --listen 127.0.0.1:8090 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any, cast

import httpx
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from hypercorn.typing import Framework

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Connection-level headers are not forwarded (RFC 9110 7.6.1); hypercorn and httpx frame bodies.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
MAX_CONNECTIONS = 512
CONNECT_TIMEOUT_S = 5.0
BACKLOG = 1024


class NaiveProxy:
    def __init__(self, upstream: str, client: httpx.AsyncClient) -> None:
        self._upstream = upstream.rstrip("/")
        self._client = client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        url = self._upstream + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        request = self._client.build_request(
            scope["method"], url, content=bytes(body), headers=headers
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            payload = f'{{"error":{{"message":"upstream: {type(exc).__name__}"}}}}'.encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 502,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": payload, "more_body": False})
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP
                    ],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError:
            return  # the upstream broke mid-body: end the response unfinished
        finally:
            await response.aclose()


async def serve_naive_proxy(listen: str, upstream: str) -> None:
    config = HypercornConfig()
    config.bind = [listen]
    config.accesslog = None
    config.backlog = BACKLOG
    limits = httpx.Limits(
        max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
    )
    # Reads are unbounded: an answer may wait long in the upstream's queue, as with any proxy
    # whose read timeout is set high for long generations.
    timeout = httpx.Timeout(
        connect=CONNECT_TIMEOUT_S, write=CONNECT_TIMEOUT_S, pool=CONNECT_TIMEOUT_S, read=None
    )
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        app = NaiveProxy(upstream, client)
        print(f"naive proxy on http://{listen} -> {upstream}", flush=True)
        await serve(cast("Framework", app), config, shutdown_trigger=trio.sleep_forever)


def _exit_now(signum: int, frame: object) -> None:
    """Gone at once on SIGTERM/SIGINT: an instrument, nothing of it is measured after the
    load. A plain handler, run between two bytecodes of whatever runs: under scenario D's 5,000
    queued requests the loop spends seconds per turn in httpcore's pool (its quadratic
    assignment), and a signal task of trio's did not run within the harness's 15 s."""
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.naive_proxy",
        description="A pass-through proxy that does not propagate client disconnects.",
    )
    parser.add_argument("--listen", default="127.0.0.1:8090", metavar="HOST:PORT")
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_now)
    signal.signal(signal.SIGINT, _exit_now)
    trio.run(partial(serve_naive_proxy, args.listen, args.upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
