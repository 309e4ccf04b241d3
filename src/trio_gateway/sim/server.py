"""`serve_sim`: the simulator as a trio service (the HTTP/1.x server plus the engine loop)."""

from __future__ import annotations

import logging
import time
from typing import Any, NoReturn

import attrs
import hypercorn.config
import trio
from hypercorn.trio.worker_context import WorkerContext

from trio_gateway.http1.listen import hypercorn_hand_off
from trio_gateway.http1.server import H1Server

from .app import SimApp
from .config import SimConfig
from .engine import SimEngine

__all__ = ["SimHandle", "serve_sim"]

# A client that takes nothing for this long is dropped (vLLM's uvicorn has no such bound; a
# benchmark's slow clients are the gateway's to drop, and come nowhere near it).
KEEP_ALIVE_WRITE_TIMEOUT_S = 300.0
# vLLM's uvicorn bounds no body; a prompt at the longest context a simulator is given is some
# megabytes of JSON.
MAX_BODY_BYTES = 64 * 1024 * 1024
HEAD_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 60.0


@attrs.frozen
class SimHandle:
    base_url: str  # "http://127.0.0.1:PORT", without /v1
    engine: SimEngine


def _hypercorn_config(config: SimConfig, host: str, port: int) -> hypercorn.config.Config:
    hc = hypercorn.config.Config()
    hc.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    # Logger objects (not "-") so hypercorn does not reconfigure the shared "hypercorn.*"
    # loggers, which the gateway's own hypercorn may use in the same process.
    hc.errorlog = logging.getLogger("trio_gateway.sim.hypercorn")
    hc.accesslog = logging.getLogger("trio_gateway.sim.access") if config.access_log else None
    return hc


async def serve_sim(
    config: SimConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    backlog: int | None = None,
    engine: SimEngine | None = None,
    task_status: trio.TaskStatus[SimHandle] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve a simulated vLLM on host:port (0: a free port) until cancelled.

    Reports a `SimHandle` once the socket listens. Cancelling the caller's scope stops the
    server, every request in flight and the engine loop. HTTP/1.x on the gateway's own server
    (``http1/server.py``): behind hypercorn the simulator spent more CPU per token than the
    gateway in front of it, on the same cores (docs/benchmarks.md); vLLM's uvicorn, with its C
    parser, is far leaner than either. Anything else (an upgrade) goes to hypercorn.
    """
    engine = engine if engine is not None else SimEngine(config)
    app: Any = SimApp(engine)
    if config.access_log:
        app = _AccessLog(app, logging.getLogger("trio_gateway.sim.access"))
    hc = _hypercorn_config(config, host, port)
    server = H1Server(
        app,
        hypercorn_hand_off(app, hc, WorkerContext(None)),
        keep_alive_timeout_s=hc.keep_alive_timeout,
        head_timeout_s=HEAD_TIMEOUT_S,
        body_timeout_s=BODY_TIMEOUT_S,
        write_timeout_s=KEEP_ALIVE_WRITE_TIMEOUT_S,
        max_body_bytes=MAX_BODY_BYTES,
    )
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=backlog)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        # A client's leaving is acted on at once, even during a burst of thousands of tokens
        # (sim/shell.py), as the gateway's own front does.
        await nursery.start(server.hang_ups.serve)
        started = await nursery.start(trio.serve_listeners, server.serve, listeners)
        address = started[0].socket.getsockname()
        bound = f"[{address[0]}]" if ":" in address[0] else address[0]
        task_status.started(SimHandle(base_url=f"http://{bound}:{address[1]}", engine=engine))
        await trio.sleep_forever()
    raise AssertionError("unreachable: the nursery only ends by cancellation")


class _AccessLog:
    """``--access-log``: one line per request (method, path, status, milliseconds)."""

    def __init__(self, app: Any, log: logging.Logger) -> None:
        self._app = app
        self._log = log

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.monotonic()
        status: list[int] = []

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self._app(scope, receive, sending)
        finally:
            self._log.info(
                '%s "%s %s" %s %.1f ms',
                scope["client"][0] if scope.get("client") else "-",
                scope["method"],
                scope["path"],
                status[0] if status else "-",
                (time.monotonic() - started) * 1000,
            )
