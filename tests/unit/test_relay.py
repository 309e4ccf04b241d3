"""relay's client-stall deadline without a server: an in-memory upstream that streams as fast as
it is read, a consumer that takes one event per period of virtual time, and a ``client_writable``
that says whether the client's socket still has room.

A client that reads, but slower than the answer comes, is dropped once it has been behind for
``client_stall_timeout_s``, though no single wait lasts that long; a consumer that is slow while
the client's socket has room (the gateway is what is behind) is not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio
import trio.testing

from tests.unit.test_mut_upstream import Handler, chat, shell, sse
from trio_gateway.config import AliasConfig
from trio_gateway.events import TextDelta
from trio_gateway.pipeline import Router
from trio_gateway.relay import CLIENT_STALL, Item, Outcome, relay

TOKENS = 400


def chunk(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


async def fast_stream(request: httpx.Request) -> httpx.Response:
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    body = sse(*[chunk("t") for _ in range(TOKENS)], last, "[DONE]")
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def router(handler: Handler) -> Router:
    upstream = shell(handler, idle_timeout_s=1000.0, first_token_timeout_s=1000.0)
    return Router({"a": AliasConfig(providers=(upstream.config,))}, {upstream.name: upstream})


async def run(
    *, every_s: float, writable: bool | None, stall_s: float = 1.0, handler: Handler = fast_stream
) -> tuple[Outcome, int, int]:
    gateway = router(handler)
    request = chat()
    texts = 0
    drops = 0

    async def consume(channel: trio.MemoryReceiveChannel[Item]) -> None:
        nonlocal texts
        async for item in channel:
            texts += isinstance(item, TextDelta)
            await trio.sleep(every_s)

    def drop() -> None:
        nonlocal drops
        drops += 1

    outcome = await relay(
        request,
        gateway.plan(request),
        buffer_events=4,
        client_stall_timeout_s=stall_s,
        consume=consume,
        drop_connection=drop,
        client_writable=None if writable is None else (lambda: writable),
    )
    return outcome, texts, drops


@pytest.mark.parametrize("writable", [False, None], ids=["socket_full", "socket_unknown"])
async def test_a_client_behind_for_the_stall_period_is_dropped(
    autojump_clock: trio.abc.Clock, writable: bool | None
) -> None:
    # One event per 0.1 s against an upstream with all 400 ready: the producer never waits a
    # whole second at once, but the buffer never drains either.
    started = trio.current_time()
    outcome, texts, drops = await run(every_s=0.1, writable=writable)
    assert outcome.cancelled == CLIENT_STALL
    assert drops == 1
    # Dropped one period after it first fell behind, not after the whole answer (40 s).
    assert trio.current_time() - started == pytest.approx(1.0, abs=0.15)
    assert 5 <= texts <= 16


async def test_a_slow_consumer_whose_client_has_room_is_not_dropped(
    autojump_clock: trio.abc.Clock,
) -> None:
    outcome, texts, drops = await run(every_s=0.1, writable=True)
    assert outcome.cancelled is None and outcome.error is None
    assert drops == 0
    assert texts == TOKENS


async def bursts(request: httpx.Request) -> httpx.Response:
    async def body() -> AsyncIterator[bytes]:
        for _ in range(BURSTS):
            yield sse(*[chunk("t") for _ in range(BURST)])
            await trio.sleep(0.5)
        yield sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}, "[DONE]")

    return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})


BURSTS, BURST = 10, 20


async def test_a_client_that_catches_up_starts_a_new_period(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Each burst keeps the client behind for 0.4 s; between bursts it catches up. Behind for
    # 4 s in all, never for a whole period at a time.
    outcome, texts, drops = await run(every_s=0.02, writable=False, stall_s=1.0, handler=bursts)
    assert outcome.cancelled is None
    assert drops == 0
    assert texts == BURSTS * BURST
