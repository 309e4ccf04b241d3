"""relay without a server: an in-memory upstream, and sinks that stand for the fronts' writers.

The producer runs in the request's own task and hands each read's events to the sink; a sink
that says its client stalled or left ends the request with that cause, the upstream released
and (for a stall) the connection dropped; how every other ending is recorded and billed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from tests.unit.test_mut_upstream import Handler, chat, shell, sse
from trio_gateway.accounting.admission import Admission
from trio_gateway.config.schema import AliasConfig
from trio_gateway.core.errors import InternalError, ShuttingDown, UpstreamProtocolError
from trio_gateway.core.events import TextDelta
from trio_gateway.core.usage import UsageRecord, estimate_prompt_tokens
from trio_gateway.dispatch.relay import (
    CLIENT_GONE,
    CLIENT_STALL,
    ClientLeft,
    ClientStalled,
    Item,
    Outcome,
    Sink,
    Watch,
    relay,
)
from trio_gateway.dispatch.router import Router

TOKENS = 400


def chunk(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


async def fast_stream(request: httpx.Request) -> httpx.Response:
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    body = sse(*[chunk("t") for _ in range(TOKENS)], last, "[DONE]")
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


BURSTS, BURST = 10, 20


async def bursts(request: httpx.Request) -> httpx.Response:
    async def body() -> AsyncIterator[bytes]:
        for _ in range(BURSTS):
            yield sse(*[chunk("t") for _ in range(BURST)])
            await trio.sleep(0.5)
        yield sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}, "[DONE]")

    return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})


def router(handler: Handler) -> Router:
    upstream = shell(handler, idle_timeout_s=1000.0, first_token_timeout_s=1000.0)
    return Router({"a": AliasConfig(providers=(upstream.config,))}, {upstream.name: upstream})


@attrs.define
class Collect:
    """A sink that keeps what it is given; ``on_put`` may wait or raise, as a client would."""

    on_put: Callable[[list[Item]], Any] | None = None
    on_end: Callable[[], Any] | None = None
    batches: list[list[Item]] = attrs.field(factory=list)
    ended: int = 0

    @property
    def items(self) -> list[Item]:
        return [item for batch in self.batches for item in batch]

    async def put(self, items: Sequence[Item]) -> None:
        self.batches.append(list(items))
        if self.on_put is not None:
            await self.on_put(self.batches[-1])

    async def end(self) -> None:
        self.ended += 1
        if self.on_end is not None:
            await self.on_end()


@attrs.define
class Records:
    records: list[UsageRecord] = attrs.field(factory=list)

    def offer(self, record: UsageRecord) -> bool:
        self.records.append(record)
        return True


def recorded(handler: Handler) -> tuple[Router, Records]:
    """A router whose usage records are kept."""
    gateway = router(handler)
    gateway.usage = records = Records()
    return gateway, records


@attrs.define
class Settlements:
    calls: list[tuple[Admission | None, UsageRecord]] = attrs.field(factory=list)

    async def settle(self, admission: Admission | None, record: UsageRecord) -> None:
        self.calls.append((admission, record))


async def run(
    gateway: Router,
    sink: Sink,
    *,
    stall_s: float = 10.0,
    watch: Sequence[Watch] = (),
    drop: Callable[[], object] | None = None,
    **kwargs: Any,
) -> Outcome:
    request = chat()
    return await relay(
        request,
        gateway.plan(request),
        sink=sink,
        client_stall_timeout_s=stall_s,
        watch=watch,
        drop_connection=drop,
        **kwargs,
    )


def texts(items: list[Item]) -> int:
    return sum(isinstance(i, TextDelta) for i in items)


# --- the producer and the sink -----------------------------------------------------------------


async def test_every_event_reaches_the_sink_in_order_and_the_answer_ends_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway = router(bursts)
    sink = Collect()
    outcome = await run(gateway, sink)
    assert outcome.cancelled is None and outcome.error is None
    assert texts(sink.items) == BURSTS * BURST
    assert sink.ended == 1
    # One put per upstream read: each burst of 20 chunks arrived in one read, so in one batch.
    assert max(texts(b) for b in sink.batches) == BURST
    assert all(sink.batches)


async def waits_forever(scope: trio.CancelScope, outcome: Outcome) -> None:
    await trio.sleep_forever()


# With a watcher beside the producer too (the request then has a nursery of its own).
@pytest.mark.parametrize("watch", [[], [waits_forever]], ids=["alone", "watched"])
async def test_a_sink_that_stalls_ends_the_request_and_drops_the_connection(
    autojump_clock: trio.abc.Clock, watch: list[Watch]
) -> None:
    gateway = router(bursts)
    drops: list[int] = []

    async def stall_at_the_third(batch: list[Item]) -> None:
        if len(sink.batches) == 3:
            raise ClientStalled("behind by 10.0 s")

    sink = Collect(on_put=stall_at_the_third)
    outcome = await run(gateway, sink, watch=watch, drop=lambda: drops.append(1))
    assert outcome.cancelled == CLIENT_STALL
    assert drops == [1]
    assert len(sink.batches) == 3 and sink.ended == 0
    assert gateway.upstreams["p1"].statistics().in_flight == 0  # the slot is free again


async def test_a_sink_whose_client_left_ends_the_request_without_a_drop(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway = router(bursts)
    drops: list[int] = []

    async def gone(batch: list[Item]) -> None:
        raise ClientLeft("connection reset")

    sink = Collect(on_put=gone)
    outcome = await run(gateway, sink, drop=lambda: drops.append(1))
    assert outcome.cancelled == CLIENT_GONE
    assert drops == []
    assert len(sink.batches) == 1 and sink.ended == 0


async def test_the_last_words_get_the_stall_period_and_no_more(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway = router(fast_stream)
    sink = Collect(on_end=trio.sleep_forever)
    started = trio.current_time()
    outcome = await run(gateway, sink, stall_s=3.0)
    assert trio.current_time() - started == pytest.approx(3.0, abs=0.01)
    assert outcome.error is None and sink.ended == 1


# --- how a request ends: shutdown, a gateway bug, billing -------------------------------------


async def test_a_draining_gateway_refuses_new_answers(autojump_clock: trio.abc.Clock) -> None:
    gateway = router(fast_stream)
    gateway.drain.begin()
    sink = Collect()
    outcome = await run(gateway, sink)
    [error] = sink.items
    assert isinstance(error, ShuttingDown)
    assert error.message == "the gateway is shutting down; retry elsewhere"
    assert error.retry_after_s == 1.0
    assert outcome.error is error
    assert sink.ended == 1
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
    sink = Collect()
    outcome = await run(gateway, sink)
    [error] = sink.items
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
    records, settlements = Records(), Settlements()
    gateway.usage = records
    gateway.limits = settlements  # type: ignore[assignment]
    admission = Admission(key="k", hold_id="h1", headers=[])
    outcome = await run(gateway, Collect(), request_id="r9", admission=admission)
    assert outcome.error is None and outcome.provider == "p1"
    [record] = records.records
    assert record.request_id == "r9" and record.completion_tokens == TOKENS
    assert record.prompt_tokens > 0  # estimated from the request: the stream had no usage
    [(settled, settled_record)] = settlements.calls
    assert settled is admission and settled_record is record
    assert record.provider == "p1"


async def test_without_a_request_id_the_record_has_none(autojump_clock: trio.abc.Clock) -> None:
    gateway, records = recorded(fast_stream)
    await run(gateway, Collect())
    assert [r.request_id for r in records.records] == [""]


async def test_a_cut_stream_is_billed_from_the_meter(autojump_clock: trio.abc.Clock) -> None:
    gateway, records = recorded(bursts)

    async def leave_after_two_bursts(batch: list[Item]) -> None:
        if texts(sink.items) >= 2 * BURST:
            raise ClientLeft("gone")

    sink = Collect(on_put=leave_after_two_bursts)
    outcome = await run(gateway, sink)
    [record] = records.records
    # The client left: what the parser had counted when the stream was cut is billed.
    assert outcome.meter.partial is not None
    assert record.completion_tokens == 2 * BURST
    assert record.estimated


async def test_cancelled_from_outside_is_a_shutdown(autojump_clock: trio.abc.Clock) -> None:
    gateway, records = recorded(fast_stream)
    outcomes: list[Outcome] = []

    async def forever(batch: list[Item]) -> None:
        await trio.sleep_forever()

    with trio.move_on_after(5):
        outcomes.append(await run(gateway, Collect(on_put=forever), stall_s=100.0))
    assert outcomes == []
    [record] = records.records
    assert record.outcome == "cancelled" and record.error_code == "shutdown"


async def test_an_error_for_a_client_that_left_is_dropped_quietly(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway = router(fast_stream)

    async def broken(*args: Any) -> None:
        await trio.sleep(1)
        raise UpstreamProtocolError("late", provider="p1")

    gateway.run = broken  # type: ignore[method-assign,assignment]

    async def gone(batch: list[Item]) -> None:
        raise ClientLeft("the client went away before the error came")

    outcome = await run(gateway, Collect(on_put=gone))
    assert isinstance(outcome.error, UpstreamProtocolError)
    assert outcome.cancelled == CLIENT_GONE


async def test_the_record_starts_when_the_request_did(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    # relay's own view of the wall clock follows the virtual one; the answer takes 5 s.
    wall = types.SimpleNamespace(time=lambda: 1000.0 + trio.current_time())
    monkeypatch.setattr("trio_gateway.dispatch.relay.time", wall)
    gateway, records = recorded(bursts)
    started = trio.current_time()
    await run(gateway, Collect())
    [record] = records.records
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
    await run(gateway, Collect(), admission=admission)
    [(settled, record)] = settlements.calls
    assert settled is admission and record.provider is None


async def test_a_drain_that_ends_mid_answer_tells_the_client(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway = router(bursts)

    async def drain_at_the_third(batch: list[Item]) -> None:
        if len(sink.batches) == 3:
            gateway.drain.cancel_all()  # the drain deadline passed

    sink = Collect(on_put=drain_at_the_third)
    outcome = await run(gateway, sink)
    assert outcome.cancelled == "shutdown"
    error = sink.items[-1]
    assert isinstance(error, ShuttingDown)
    assert error.message == "the gateway shut down before the answer finished"
    assert texts(sink.items) < BURSTS * BURST
    assert sink.ended == 1


async def test_the_watcher_cancels_the_request_s_scope(autojump_clock: trio.abc.Clock) -> None:
    gateway = router(bursts)
    started = trio.current_time()

    async def client_leaves(scope: trio.CancelScope, outcome: Outcome) -> None:
        await trio.sleep(1.0)
        outcome.cancelled = "client_gone"
        scope.cancel()

    sink = Collect()
    outcome = await run(gateway, sink, watch=[client_leaves])
    assert outcome.cancelled == "client_gone"
    assert trio.current_time() - started == pytest.approx(1.0)
    assert 0 < texts(sink.items) < BURSTS * BURST
    assert sink.ended == 0  # nobody to end it for


async def test_watchers_stop_when_the_answer_ends(autojump_clock: trio.abc.Clock) -> None:
    gateway = router(fast_stream)
    stopped: list[bool] = []

    async def waits(scope: trio.CancelScope, outcome: Outcome) -> None:
        try:
            await trio.sleep_forever()
        finally:
            stopped.append(True)

    started = trio.current_time()
    outcome = await run(gateway, Collect(), watch=[waits, waits])
    assert outcome.cancelled is None
    assert stopped == [True, True]
    assert trio.current_time() == started


async def test_an_answer_begun_releases_the_parsed_body_and_keeps_its_prompt_estimate(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway, records = recorded(fast_stream)
    request = chat()
    messages = request.body["messages"]
    seen: list[dict[str, Any]] = []

    async def put(items: list[Item]) -> None:
        seen.append(request.body)

    await relay(request, gateway.plan(request), sink=Collect(on_put=put), client_stall_timeout_s=1)
    # Released before the first events reached the client, not only at the end.
    assert seen and seen[0] == {}
    assert request.body == {}
    [record] = records.records
    assert record.prompt_tokens == estimate_prompt_tokens(messages) > 0


def test_a_request_not_released_estimates_from_its_body_and_a_released_one_from_its_estimate() -> (
    None
):
    request = chat()
    before = request.prompt_estimate()
    assert before == estimate_prompt_tokens(request.body["messages"]) > 0
    request.release_body()
    request.release_body()  # twice: the estimate taken the first time stays
    assert request.body == {} and request.prompt_estimate() == before


async def test_a_server_stopping_around_a_watched_answer_records_a_shutdown(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Cancelled from outside, the request's nursery (there is a watcher) raises a group of
    # Cancelled: still a shutdown, in the record.
    gateway, records = recorded(bursts)
    with trio.move_on_after(1.2):
        await run(gateway, Collect(), watch=[waits_forever])
    [record] = records.records
    assert (record.outcome, record.error_code) == ("cancelled", "shutdown")
