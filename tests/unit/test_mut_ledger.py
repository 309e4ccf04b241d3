"""The usage queue's batching to the record, and the help texts of the money path's metrics
(mutation testing, docs/testing.md)."""

from __future__ import annotations

import trio
import trio.testing
from prometheus_client import CollectorRegistry, generate_latest

from tests.unit.test_usage import one
from trio_gateway.accounting.admission import local_limits
from trio_gateway.accounting.ledger import QueuedSink
from trio_gateway.config.schema import UsageConfig


async def test_a_gathering_batch_wakes_when_the_records_behind_its_first_fill_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = QueuedSink(UsageConfig(queue_size=10, batch_max=3, flush_interval_s=100.0))
    batches: list[tuple[float, int]] = []

    async def serve() -> None:
        async for batch in sink._batches():
            batches.append((trio.current_time(), len(batch)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        sink.offer(one(0))
        await trio.testing.wait_all_tasks_blocked()  # its batch gathers
        sink.offer(one(1))
        await trio.testing.wait_all_tasks_blocked()
        assert batches == []  # one behind the first: not full yet
        sink.offer(one(2))
        await trio.testing.wait_all_tasks_blocked()
        assert batches == [(0.0, 3)]  # full: at once, not after the interval
        sink.offer(one(3))
        await trio.testing.wait_all_tasks_blocked()
        sink.offer(one(4))
        sink.offer(one(5))
        await trio.testing.wait_all_tasks_blocked()
        assert batches == [(0.0, 3), (0.0, 3)]
        sink.close()
    assert sink.statistics().queued == 0


def test_the_dropped_records_and_the_store_errors_say_what_they_count() -> None:
    registry = CollectorRegistry()
    sink = QueuedSink(UsageConfig(queue_size=1))
    registry.register(sink.collector())
    registry.register(local_limits().collector())
    text = generate_latest(registry).decode()
    assert (
        "# HELP gateway_usage_dropped_total Usage records dropped: the ledger's queue was "
        "full, or a write failed\n"
    ) in text
    assert 'gateway_usage_dropped_total{reason="queue_full"} 0.0' in text
    assert 'gateway_usage_dropped_total{reason="write_failed"} 0.0' in text
    assert (
        "# HELP gateway_limits_store_errors_total Budget and rate-limit store calls that "
        "failed or missed [redis] timeout_s\n"
    ) in text
