"""The usage ledger: every request's record, written to SQLite off the event loop.

::

    relay.record ──offer()──▶ bounded channel ──▶ serve_ledger: batch (batch_max, or
      (never blocks: a full      (queue_size)      flush_interval_s after the first record)
       queue drops the record,                     ──trio.to_thread──▶ SQLite (WAL), table usage
       counts it, logs at most
       once per DROP_LOG_INTERVAL_S)

On shutdown the queue is written out before the service ends: the service runs shielded and
ends when :meth:`SQLiteLedger.close` closes the queue, which the server does once every request
has ended (and so has offered its record).
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import attrs
import trio
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from trio_gateway.accounting.sqlite_file import use_wal
from trio_gateway.config.schema import GatewayConfig, UsageConfig
from trio_gateway.core.usage import UsageRecord

log = logging.getLogger("trio_gateway")

LEDGER_NONE = "none"
LEDGER_MEMORY = ":memory:"
DEFAULT_LEDGER_NAME = "trio-gateway-usage.sqlite3"
# A full queue logs at most one line this often (the metric counts every record).
DROP_LOG_INTERVAL_S = 10.0
# After close, the longest the last records may take to be written.
CLOSE_FLUSH_TIMEOUT_S = 30.0

COLUMNS = (
    "request_id",
    "key",
    "alias",
    "provider",
    "outcome",
    "error_code",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_tokens",
    "estimated",
    "ttft_s",
    "duration_s",
    "started_at",
    "endpoint",
    "filtered",
    "priority",
    "dropped_tools",
    "cost_nanos",
)
SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL,
    key TEXT,
    alias TEXT,
    provider TEXT,
    outcome TEXT NOT NULL,
    error_code TEXT,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    reasoning_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    estimated INTEGER NOT NULL,
    ttft_s REAL,
    duration_s REAL NOT NULL,
    started_at REAL NOT NULL,
    endpoint TEXT NOT NULL DEFAULT 'chat',
    filtered TEXT,
    priority INTEGER,
    dropped_tools TEXT,
    cost_nanos INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS usage_started_at ON usage (started_at);
"""
# A key's spend since a time (a budget's period: accounting/spend.py), read from the index
# alone, never the table; made after the migration, since older ledgers lack cost_nanos.
SPEND_INDEX = "CREATE INDEX IF NOT EXISTS usage_key_spend ON usage (key, started_at, cost_nanos)"
_INSERT = f"INSERT INTO usage ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"


def ledger_path(config: GatewayConfig) -> str | None:
    """The ledger file ``config`` names; None for ``ledger = "none"``.

    Unset: ``trio-gateway-usage.sqlite3`` next to the config file, or in memory when the
    config was not read from a file. A relative path is read from the config file's directory.
    """
    ledger = config.usage.ledger
    if ledger == LEDGER_NONE or config.usage.sink != "sqlite":
        return None
    if ledger == LEDGER_MEMORY:
        return LEDGER_MEMORY
    # Absolute, so the start-up line and every error say which file it is.
    folder = Path(config.source).absolute().parent
    if ledger is None:
        return str(folder / DEFAULT_LEDGER_NAME) if Path(config.source).is_file() else LEDGER_MEMORY
    path = Path(ledger).expanduser()
    return str(path if path.is_absolute() else folder / path)


def connect(path: str) -> sqlite3.Connection:
    """Open (creating if need be) a ledger. Blocking: call it from a worker thread."""
    if path != LEDGER_MEMORY:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    # Used from one worker thread at a time, never two at once: serve_ledger awaits each call.
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    use_wal(conn)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(SCHEMA)
    migrate(conn)
    conn.execute(SPEND_INDEX)
    return conn


# Columns added since the first ledgers, with what the rows written before them hold.
ADDED_COLUMNS = {
    "endpoint": "TEXT NOT NULL DEFAULT 'chat'",
    "filtered": "TEXT",
    "priority": "INTEGER",
    "dropped_tools": "TEXT",
    "cost_nanos": "INTEGER NOT NULL DEFAULT 0",
}


def migrate(conn: sqlite3.Connection) -> None:
    """Add to a ledger written by an older gateway the columns it lacks: before /v1/completions
    and /v1/embeddings, every record was a chat's."""
    present = {name for _, name, *_ in conn.execute("PRAGMA table_info(usage)")}
    for name, definition in ADDED_COLUMNS.items():
        if name not in present:
            conn.execute(f"ALTER TABLE usage ADD COLUMN {name} {definition}")


def row(record: UsageRecord) -> tuple[object, ...]:
    return (
        record.request_id,
        record.key,
        record.alias,
        record.provider,
        record.outcome,
        record.error_code,
        record.prompt_tokens,
        record.completion_tokens,
        record.reasoning_tokens,
        record.cached_tokens,
        int(record.estimated),
        record.ttft_s,
        record.duration_s,
        record.started_at,
        record.endpoint,
        record.filtered,
        record.priority,
        record.dropped_tools,
        record.cost_nanos,
    )


def write_batch(conn: sqlite3.Connection, records: Sequence[UsageRecord]) -> None:
    """One transaction per batch. Blocking: call it from a worker thread."""
    with conn:
        conn.execute("BEGIN")
        conn.executemany(_INSERT, [row(r) for r in records])


@attrs.frozen(kw_only=True)
class LedgerStats:
    queued: int
    written: int
    dropped_queue_full: int
    dropped_write_failed: int


class QueuedSink:
    """A :class:`~trio_gateway.core.usage.UsageSink`: records are queued without waiting and
    written in batches by a service task (:func:`serve_ledger`, or
    ``usage_stream.serve_usage_stream``)."""

    def __init__(self, config: UsageConfig) -> None:
        self.batch_max = config.batch_max
        self.flush_interval_s = config.flush_interval_s
        self._send, self._receive = trio.open_memory_channel[UsageRecord](config.queue_size)
        self._written = 0
        self._dropped_full = 0
        self._dropped_failed = 0
        self._last_drop_log = -math.inf
        # The service runs shielded (so the queue is written out when the server is cancelled)
        # until close(); close() also puts a deadline on that last flush.
        self._scope = trio.CancelScope(shield=True)
        self._closed = False
        # While a batch gathers: the records queued behind its first, and the event that wakes
        # the service once they fill it (or at close). Taking each record as it came cost the
        # service a schedule point per request; this wakes it once per batch.
        self._gathering: trio.Event | None = None
        self._gathered = 0

    def offer(self, record: UsageRecord) -> bool:
        try:
            self._send.send_nowait(record)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self._dropped_full += 1
        else:
            if self._gathering is not None:
                self._gathered += 1
                if self._gathered >= self.batch_max - 1:
                    self._gathering.set()
            return True
        now = trio.current_time()
        if now - self._last_drop_log >= DROP_LOG_INTERVAL_S:
            self._last_drop_log = now
            log.warning(
                "usage ledger queue full: %d records dropped so far (gateway_usage_dropped_total)",
                self._dropped_full,
            )
        return False

    def close(self) -> None:
        """No more records: the service writes what is queued, then ends."""
        self._send.close()
        self._closed = True
        if self._gathering is not None:
            self._gathering.set()
        self._scope.deadline = min(
            self._scope.deadline, trio.current_time() + CLOSE_FLUSH_TIMEOUT_S
        )

    def statistics(self) -> LedgerStats:
        return LedgerStats(
            queued=self._send.statistics().current_buffer_used,
            written=self._written,
            dropped_queue_full=self._dropped_full,
            dropped_write_failed=self._dropped_failed,
        )

    def collector(self) -> Collector:
        return _DroppedCollector(self)

    async def _batches(self) -> AsyncIterator[list[UsageRecord]]:
        """Up to ``batch_max`` records, or what came within ``flush_interval_s`` of the first."""
        receive = self._receive
        while True:
            try:
                batch = [await receive.receive()]
            except trio.EndOfChannel:
                return
            self._gathered = self._send.statistics().current_buffer_used
            if self._gathered < self.batch_max - 1 and not self._closed:
                gathering = self._gathering = trio.Event()
                with trio.move_on_after(self.flush_interval_s):
                    await gathering.wait()
                self._gathering = None
            ended = False
            while len(batch) < self.batch_max:
                try:
                    batch.append(receive.receive_nowait())
                except trio.WouldBlock:
                    break
                except trio.EndOfChannel:
                    ended = True
                    break
            yield batch
            if ended:
                return


class SQLiteLedger(QueuedSink):
    """The queue, written to SQLite by :func:`serve_ledger`."""

    def __init__(self, path: str, config: UsageConfig) -> None:
        super().__init__(config)
        self.path = path


class _DroppedCollector(Collector):
    def __init__(self, ledger: QueuedSink) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        stats = self._ledger.statistics()
        dropped = CounterMetricFamily(
            "gateway_usage_dropped",
            "Usage records dropped: the ledger's queue was full, or a write failed",
            labels=["reason"],
        )
        dropped.add_metric(["queue_full"], stats.dropped_queue_full)
        dropped.add_metric(["write_failed"], stats.dropped_write_failed)
        yield dropped


async def serve_ledger(
    ledger: SQLiteLedger, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Open the ledger, then write batches until :meth:`SQLiteLedger.close`."""
    conn = await trio.to_thread.run_sync(connect, ledger.path)
    try:
        task_status.started()
        with ledger._scope:
            async for batch in ledger._batches():
                try:
                    await trio.to_thread.run_sync(write_batch, conn, batch)
                    ledger._written += len(batch)
                except sqlite3.Error as exc:
                    ledger._dropped_failed += len(batch)
                    log.error(
                        "usage ledger %s: %d records not written: %s", ledger.path, len(batch), exc
                    )
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(conn.close)
