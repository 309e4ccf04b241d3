"""The floor under the gateway's per-request cost: its front serving a canned answer.

The same serve loop, config and listening sockets as ``trio-gateway serve`` (``listen.serve_asgi``:
the gateway's HTTP/1.x server, ``server.hypercorn_config``), and an ASGI app that reads the
request body and answers a fixed ``chat.completion`` of the gateway's size: what one request
costs before the gateway does anything. ``--server hypercorn`` serves it with hypercorn's own
serve loop instead (the front the gateway had before its own; kept to show what it cost).
``--upstream`` adds the upstream exchange on the gateway's own lean HTTP/1.1 client
(``http1/client.py``), its answer read whole and dropped: the floor of a pass-through on
the gateway's stack. ``bench/request_instructions.py --floor`` counts each.

    python -m bench.server_floor --listen 127.0.0.1:8080 [--server hypercorn]
        [--upstream http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

import trio

from trio_gateway.fronts.http import read_body
from trio_gateway.http1.client import H1Pool
from trio_gateway.http1.listen import Connections, serve_asgi
from trio_gateway.process.serve import hypercorn_config, listening_sockets

# What the gateway answers scenario A's request (its size and headers; the values do not matter).
ANSWER = json.dumps(
    {
        "id": "chatcmpl-0123456789abcdef01234567",
        "object": "chat.completion",
        "created": 1796094057,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " mild"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 16, "completion_tokens": 1, "total_tokens": 17},
    },
    separators=(",", ":"),
).encode()
HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(ANSWER)).encode()),
    (b"x-request-id", b"0123456789abcdef01234567"),
]
UPSTREAM_BODY = json.dumps(
    {
        "model": "qwen3-32b",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "stream": True,
    }
).encode()


def make_app(upstream: str | None) -> Any:
    pool = H1Pool(
        "floor",
        max_idle=64,
        idle_expiry_s=2.0,
        connect_timeout_s=5.0,
        write_timeout_s=5.0,
    )
    headers = {"content-type": "application/json", "accept": "text/event-stream"}

    async def app(scope: Any, receive: Any, send: Any) -> None:
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
        await read_body(receive, 1 << 20)
        if upstream is not None and scope["method"] == "POST":
            response = await pool.post(upstream + "/chat/completions", headers, UPSTREAM_BODY)
            try:
                while await response.receive():
                    pass
            finally:
                await response.aclose()
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        await send({"type": "http.response.body", "body": ANSWER, "more_body": False})

    return app


async def serve(listen: str, upstream: str | None, server: str) -> None:
    from hypercorn.trio import serve as hypercorn_serve

    config = hypercorn_config(listen, graceful_timeout_s=2.0, websocket_max_message_bytes=1 << 20)
    sockets = listening_sockets(config, stall_timeout_s=30.0)
    stop = trio.Event()

    async def trigger() -> None:
        await stop.wait()

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            app = make_app(upstream)
            if server == "hypercorn":
                for sock in sockets.insecure_sockets:
                    sock.close()  # hypercorn binds its own
                nursery.start_soon(
                    lambda: hypercorn_serve(app, config, shutdown_trigger=trigger, mode="asgi")
                )
            else:
                nursery.start_soon(
                    lambda: serve_asgi(
                        app,
                        config,
                        sockets,
                        Connections(),
                        shutdown_trigger=trigger,
                        write_timeout_s=30.0,
                        head_timeout_s=30.0,
                        body_timeout_s=60.0,
                        max_body_bytes=4 * 1024 * 1024,
                    )
                )
            async for _ in signals:
                stop.set()
                break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server_floor", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT")
    parser.add_argument("--server", choices=("h1", "hypercorn"), default="h1")
    parser.add_argument("--upstream", help="base URL with /v1: also ask it, as the gateway does")
    args = parser.parse_args(argv)
    trio.run(serve, args.listen, args.upstream, args.server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
