"""relay's client-stall deadline without a server: an in-memory upstream that streams as fast as
it is read, a consumer that takes one event per period of virtual time, and a ``client_writable``
that says whether the client's socket still has room.

A client that reads, but slower than the answer comes, is dropped once it has been behind for
``client_stall_timeout_s``, though no single wait lasts that long; a consumer that is slow while
the client's socket has room (the gateway is what is behind) is not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from tests.unit.test_mut_upstream import Handler, chat, shell, sse
from trio_gateway.accounting import Admission
from trio_gateway.config import AliasConfig, ProviderConfig
from trio_gateway.errors import InternalError, ShuttingDown, UpstreamProtocolError
from trio_gateway.events import TextDelta
from trio_gateway.pipeline import Router
from trio_gateway.relay import CLIENT_STALL, Item, Outcome, relay
from trio_gateway.usage import UsageRecord

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


# --- how a request ends: shutdown, a gateway bug, billing -------------------------------------


@attrs.define
class Sink:
    records: list[UsageRecord] = attrs.field(factory=list)

    def offer(self, record: UsageRecord) -> bool:
        self.records.append(record)
        return True


@attrs.define
class Settlements:
    calls: list[tuple[Admission | None, UsageRecord, ProviderConfig | None]] = attrs.field(
        factory=list
    )

    async def settle(
        self, admission: Admission | None, record: UsageRecord, provider: ProviderConfig | None
    ) -> None:
        self.calls.append((admission, record, provider))


async def collect_all(gateway: Router, **kwargs: Any) -> tuple[Outcome, list[Item]]:
    items: list[Item] = []

    async def consume(channel: trio.MemoryReceiveChannel[Item]) -> None:
        async for item in channel:
            items.append(item)

    request = chat()
    outcome = await relay(
        request,
        gateway.plan(request),
        buffer_events=4,
        client_stall_timeout_s=1.0,
        consume=consume,
        **kwargs,
    )
    return outcome, items


async def test_a_draining_gateway_refuses_new_answers(autojump_clock: trio.abc.Clock) -> None:
    gateway = router(fast_stream)
    gateway.drain.begin()
    outcome, items = await collect_all(gateway)
    [error] = items
    assert isinstance(error, ShuttingDown)
    assert error.message == "the gateway is shutting down; retry elsewhere"
    assert error.retry_after_s == 1.0
    assert outcome.error is error
    assert fast_stream_calls(gateway) == 0


def fast_stream_calls(gateway: Router) -> float:
    return (
        gateway.metrics.registry.get_sample_value(
            "gateway_requests_total",
            {"alias": "a", "provider": "p1", "outcome": "ok", "code": ""},
        )
        or 0
    )


async def test_a_gateway_bug_is_an_internal_error_with_its_class_name(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = router(fast_stream)

    async def broken(*args: Any) -> None:
        raise KeyError("boom")

    gateway.run = broken  # type: ignore[method-assign,assignment]
    outcome, items = await collect_all(gateway)
    [error] = items
    assert isinstance(error, InternalError)
    assert error.message == "internal error: KeyError"
    assert outcome.error is error
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "internal error while serving a"
    ]


async def test_the_record_is_offered_and_the_hold_settled_at_the_answering_provider(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway = router(fast_stream)
    sink, settlements = Sink(), Settlements()
    gateway.usage = sink
    gateway.limits = settlements  # type: ignore[assignment]
    admission = Admission(key="k", hold_id="h1", headers=[])
    outcome, _ = await collect_all(gateway, request_id="r9", admission=admission)
    assert outcome.error is None and outcome.provider == "p1"
    [record] = sink.records
    assert record.request_id == "r9" and record.completion_tokens == TOKENS
    assert record.prompt_tokens > 0  # estimated from the request: the stream had no usage
    [(settled, settled_record, provider)] = settlements.calls
    assert settled is admission and settled_record is record
    assert provider is gateway.upstreams["p1"].config


async def test_without_a_request_id_the_record_has_none(autojump_clock: trio.abc.Clock) -> None:
    gateway = router(fast_stream)
    sink = Sink()
    gateway.usage = sink
    await collect_all(gateway)
    assert [r.request_id for r in sink.records] == [""]


async def test_a_cut_stream_is_billed_from_the_meter(autojump_clock: trio.abc.Clock) -> None:
    gateway = router(fast_stream)
    sink = Sink()
    gateway.usage = sink
    seen = 0

    async def leave_early(channel: trio.MemoryReceiveChannel[Item]) -> None:
        nonlocal seen
        async for item in channel:
            seen += isinstance(item, TextDelta)
            if seen == 10:
                return

    request = chat()
    outcome = await relay(
        request,
        gateway.plan(request),
        buffer_events=4,
        client_stall_timeout_s=1.0,
        consume=leave_early,
    )
    [record] = sink.records
    # The consumer left: what the parser had counted when the stream was cut is billed.
    assert outcome.meter.partial is not None
    assert 10 <= record.completion_tokens < TOKENS
    assert record.estimated


async def test_cancelled_from_outside_is_a_shutdown(autojump_clock: trio.abc.Clock) -> None:
    gateway = router(fast_stream)
    outcomes: list[Outcome] = []
    request = chat()

    async def forever(channel: trio.MemoryReceiveChannel[Item]) -> None:
        await trio.sleep_forever()

    sink = Sink()
    gateway.usage = sink
    with trio.move_on_after(5):
        outcomes.append(
            await relay(
                request,
                gateway.plan(request),
                buffer_events=4,
                client_stall_timeout_s=100.0,
                consume=forever,
            )
        )
    assert outcomes == []
    [record] = sink.records
    assert record.outcome == "cancelled" and record.error_code == "shutdown"


async def test_an_error_for_a_consumer_that_left_is_dropped_quietly(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway = router(fast_stream)

    async def broken(*args: Any) -> None:
        await trio.sleep(1)
        raise UpstreamProtocolError("late", provider="p1")

    gateway.run = broken  # type: ignore[method-assign,assignment]

    async def gone(channel: trio.MemoryReceiveChannel[Item]) -> None:
        await channel.aclose()  # the client went away before the error came
        await trio.sleep(2)

    request = chat()
    outcome = await relay(
        request,
        gateway.plan(request),
        buffer_events=4,
        client_stall_timeout_s=10.0,
        consume=gone,
    )
    assert isinstance(outcome.error, UpstreamProtocolError)


async def test_the_record_starts_when_the_request_did(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    # relay's own view of the wall clock follows the virtual one; the answer takes 5 s.
    wall = types.SimpleNamespace(time=lambda: 1000.0 + trio.current_time())
    monkeypatch.setattr("trio_gateway.relay.time", wall)
    gateway = router(bursts)
    sink = Sink()
    gateway.usage = sink
    started = trio.current_time()
    await collect_all(gateway)
    [record] = sink.records
    assert record.started_at == 1000.0 + started
    assert record.duration_s == pytest.approx(5.0, abs=0.1)


async def test_a_hold_is_settled_without_prices_when_no_provider_answered(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway = router(fast_stream)
    gateway.drain.begin()  # refused before any provider
    settlements = Settlements()
    gateway.limits = settlements  # type: ignore[assignment]
    admission = Admission(key="k", hold_id="h1", headers=[])
    await collect_all(gateway, admission=admission)
    [(settled, record, provider)] = settlements.calls
    assert settled is admission and record.provider is None and provider is None


async def test_a_drain_that_ends_mid_answer_tells_the_client(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway = router(bursts)
    items: list[Item] = []

    async def consume(channel: trio.MemoryReceiveChannel[Item]) -> None:
        async for item in channel:
            items.append(item)
            if len(items) == 3:
                gateway.drain.cancel_all()  # the drain deadline passed

    request = chat()
    outcome = await relay(
        request,
        gateway.plan(request),
        buffer_events=4,
        client_stall_timeout_s=10.0,
        consume=consume,
    )
    assert outcome.cancelled == "shutdown"
    error = items[-1]
    assert isinstance(error, ShuttingDown)
    assert error.message == "the gateway shut down before the answer finished"
    assert sum(isinstance(i, TextDelta) for i in items) < BURSTS * BURST


async def test_the_watcher_cancels_the_request_s_scope(autojump_clock: trio.abc.Clock) -> None:
    gateway = router(bursts)
    started = trio.current_time()

    async def client_leaves(scope: trio.CancelScope, outcome: Outcome) -> None:
        await trio.sleep(1.0)
        outcome.cancelled = "client_gone"
        scope.cancel()

    outcome, items = await collect_all(gateway, watch=client_leaves)
    assert outcome.cancelled == "client_gone"
    assert trio.current_time() - started == pytest.approx(1.0)
    assert 0 < sum(isinstance(i, TextDelta) for i in items) < BURSTS * BURST
