"""`serve_sim`: the simulator as a trio service (hypercorn's trio worker plus the engine loop)."""

from __future__ import annotations

import logging
from functools import partial
from typing import NoReturn, cast

import attrs
import hypercorn.config
import hypercorn.trio
import hypercorn.typing
import trio

from .app import SimApp
from .config import SimConfig
from .engine import SimEngine

__all__ = ["SimHandle", "serve_sim"]


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
    task_status: trio.TaskStatus[SimHandle] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve a simulated vLLM on host:port (0: a free port) until cancelled.

    Reports a `SimHandle` once the socket listens. Cancelling the caller's scope stops the
    server, every request in flight and the engine loop.
    """
    engine = SimEngine(config)
    # SimApp types ASGI messages as plain mappings; hypercorn wants its TypedDicts. Same shape.
    app = cast(hypercorn.typing.ASGIFramework, SimApp(engine))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        binds: list[str] = await nursery.start(
            partial(hypercorn.trio.serve, app, _hypercorn_config(config, host, port), mode="asgi")
        )
        task_status.started(SimHandle(base_url=binds[0], engine=engine))
        await trio.sleep_forever()
    raise AssertionError("unreachable: the nursery only ends by cancellation")
