from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import httpx
import pytest
import trio

from trio_gateway.sim import SimConfig, SimHandle, serve_sim

StartSim = Callable[..., Awaitable[SimHandle]]

# Fast engine timings: these tests are about the protocol, not about speed.
FAST = {"decode_step_s": 0.0005, "decode_step_s_per_seq": 0.0, "prefill_s_per_token": 0.0}


@pytest.fixture
def start_sim(nursery: trio.Nursery) -> StartSim:
    """Start a simulator on a free port, in the test's nursery (cancelled after the test)."""

    async def start(**fields: object) -> SimHandle:
        config = SimConfig(**{**FAST, **fields})  # type: ignore[arg-type]
        handle: SimHandle = await nursery.start(partial(serve_sim, config))
        return handle

    return start


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as c:
        yield c
