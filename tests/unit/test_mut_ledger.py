"""The usage queue's batching to the record, and the help texts of the money path's metrics
(mutation testing, docs/testing.md)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry, generate_latest

from tests.unit.test_usage import one
from trio_gateway.accounting import ledger as ledger_module
from trio_gateway.accounting.admission import local_limits
from trio_gateway.accounting.ledger import (
    DROP_LOG_INTERVAL_S,
    QueuedSink,
    SQLiteLedger,
    serve_ledger,
)
from trio_gateway.config.schema import UsageConfig
from trio_gateway.core.usage import UsageRecord


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


async def test_a_full_queue_is_logged_again_after_the_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    sink = QueuedSink(UsageConfig(queue_size=1))
    assert sink.offer(one(0))
    with caplog.at_level(logging.WARNING, logger="trio_gateway"):
        assert not sink.offer(one(1))
        await trio.sleep(DROP_LOG_INTERVAL_S - 0.5)
        assert not sink.offer(one(2))  # within the interval: counted, not logged
        await trio.sleep(0.5)
        assert not sink.offer(one(3))
    assert [r.getMessage() for r in caplog.records] == [
        "usage ledger queue full: 1 records dropped so far (gateway_usage_dropped_total)",
        "usage ledger queue full: 3 records dropped so far (gateway_usage_dropped_total)",
    ]


async def test_batches_that_fail_to_be_written_are_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(conn: sqlite3.Connection, records: Sequence[UsageRecord]) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(ledger_module, "write_batch", fail)
    path = str(tmp_path / "u.sqlite3")
    ledger = SQLiteLedger(path, UsageConfig(batch_max=2, flush_interval_s=0.01))
    for i in range(3):
        ledger.offer(one(i))
    ledger.close()  # the queue is written out (here: fails) in batches of 2, then 1
    with caplog.at_level(logging.ERROR, logger="trio_gateway"), trio.fail_after(10):
        await serve_ledger(ledger)
    assert ledger.statistics().dropped_write_failed == 3
    assert ledger.statistics().written == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"usage ledger {path}: 2 records not written: database or disk is full",
        f"usage ledger {path}: 1 records not written: database or disk is full",
    ]


def test_a_ledger_in_a_new_folder_creates_it(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "u.sqlite3"
    conn = ledger_module.connect(str(path))
    conn.close()
    assert path.is_file()


async def test_a_ledger_opened_in_one_thread_is_written_from_another(tmp_path: Path) -> None:
    # serve_ledger opens it in one worker thread and writes from whichever runs next.
    conn = ledger_module.connect(str(tmp_path / "u.sqlite3"))
    try:
        await trio.to_thread.run_sync(ledger_module.write_batch, conn, [one(0)])
        assert conn.execute("SELECT request_id FROM usage").fetchall() == [("r0",)]
    finally:
        conn.close()


async def test_a_cancelled_service_still_closes_its_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[sqlite3.Connection] = []
    connect = ledger_module.connect

    def recorded(path: str) -> sqlite3.Connection:
        opened.append(connect(path))
        return opened[-1]

    monkeypatch.setattr(ledger_module, "connect", recorded)
    ledger = SQLiteLedger(str(tmp_path / "u.sqlite3"), UsageConfig(flush_interval_s=0.01))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_ledger, ledger)
            ledger.offer(one(0))
            nursery.cancel_scope.cancel()  # the server stops: the queue is written out
            ledger.close()
    assert ledger.statistics().written == 1
    [conn] = opened
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")


async def _batch_times(sink: QueuedSink) -> list[tuple[float, int]]:
    return [(trio.current_time(), len(batch)) async for batch in sink._batches()]


async def test_a_batch_one_short_of_full_waits_for_the_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = QueuedSink(UsageConfig(queue_size=10, batch_max=3, flush_interval_s=5.0))
    sink.offer(one(0))
    sink.offer(one(1))
    async with trio.open_nursery() as nursery:
        batches: list[tuple[float, int]] = []

        async def serve() -> None:
            async for batch in sink._batches():
                batches.append((trio.current_time(), len(batch)))

        nursery.start_soon(serve)
        await trio.sleep(6.0)
        assert batches == [(5.0, 2)]
        sink.close()


async def test_a_closed_queue_is_written_out_without_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = QueuedSink(UsageConfig(queue_size=10, batch_max=3, flush_interval_s=5.0))
    sink.offer(one(0))
    sink.close()
    assert await _batch_times(sink) == [(0.0, 1)]
