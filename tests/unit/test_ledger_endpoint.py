"""The ledger's added columns (endpoint, priority): written for every record, added to a ledger
an older gateway wrote, and read as chat (no class) from one not yet opened by a newer
gateway."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import attrs

from trio_gateway.accounting.ledger import COLUMNS, connect, write_batch
from trio_gateway.cli.usage import records, table
from trio_gateway.core.usage import UsageRecord

# The table as the first ledgers had it: no endpoint.
OLD_SCHEMA = """
CREATE TABLE usage (
    id INTEGER PRIMARY KEY, request_id TEXT NOT NULL, key TEXT, alias TEXT, provider TEXT,
    outcome TEXT NOT NULL, error_code TEXT, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, reasoning_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL, estimated INTEGER NOT NULL, ttft_s REAL,
    duration_s REAL NOT NULL, started_at REAL NOT NULL
);
INSERT INTO usage VALUES (1, 'old', NULL, 'a', 'p', 'completed', NULL, 3, 4, 0, 0, 0, NULL,
    0.1, 1.0);
"""


def record(request_id: str, endpoint: str, priority: int | None = None) -> UsageRecord:
    return UsageRecord(
        request_id=request_id,
        key=None,
        alias="a",
        provider="p",
        outcome="completed",
        prompt_tokens=5,
        started_at=2.0,
        endpoint=endpoint,
        priority=priority,
    )


def old_ledger(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA)
    conn.close()


def test_an_older_ledger_is_read_as_chat_then_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    old_ledger(path)
    readonly = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert [r["endpoint"] for r in records(readonly, None)] == ["chat"]
    assert [row[0] for row in table(readonly, "endpoint", None)] == ["chat"]
    readonly.close()
    conn = connect(str(path))  # the gateway opening it
    write_batch(conn, [record("new", "embeddings")])
    conn.close()
    conn = sqlite3.connect(path)
    assert [r["endpoint"] for r in records(conn, None)] == ["chat", "embeddings"]
    assert [row[:2] for row in table(conn, "endpoint", None)] == [("chat", 1), ("embeddings", 1)]
    assert "endpoint" in COLUMNS
    conn.close()


def test_the_priority_class_is_recorded_and_grouped(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    old_ledger(path)
    readonly = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert [r["priority"] for r in records(readonly, None)] == [None]
    assert [row[:2] for row in table(readonly, "priority", None)] == [("-", 1)]
    readonly.close()
    conn = connect(str(path))
    write_batch(conn, [record("paid", "chat", 0), record("free", "chat", 3)])
    write_batch(conn, [record("free2", "chat", 3)])
    conn.close()
    conn = sqlite3.connect(path)
    assert [r["priority"] for r in records(conn, None)] == [None, 0, 3, 3]
    assert [row[:2] for row in table(conn, "priority", None)] == [(0, 1), (3, 2), ("-", 1)]


def test_dropped_tools_column_written_added_and_read_as_none_from_an_older_ledger(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.sqlite3"
    old_ledger(path)
    readonly = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert [r["dropped_tools"] for r in records(readonly, None)] == [None]
    readonly.close()
    conn = connect(str(path))
    noted = attrs.evolve(record("new", "messages"), dropped_tools="web_search_20250305,other")
    write_batch(conn, [noted])
    conn.close()
    conn = sqlite3.connect(path)
    assert [r["dropped_tools"] for r in records(conn, None)] == [None, "web_search_20250305,other"]
    conn.close()


def test_cost_is_written_added_to_an_older_ledger_and_read_as_0_before(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    old_ledger(path)
    readonly = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert [r["cost_nanos"] for r in records(readonly, None)] == [0]
    assert [row[-1] for row in table(readonly, "alias", None)] == [0]  # the cost column
    readonly.close()
    conn = connect(str(path))
    write_batch(conn, [attrs.evolve(record("priced", "chat"), key="alice", cost_nanos=1_250)])
    conn.close()
    conn = sqlite3.connect(path)
    assert [r["cost_nanos"] for r in records(conn, None)] == [0, 1_250]
    assert [(row[0], row[-1]) for row in table(conn, "key", None)] == [("-", 0), ("alice", 1_250)]
    # A key's spend in a period is read from an index, not the whole table.
    plan = conn.execute(
        "EXPLAIN QUERY PLAN SELECT sum(cost_nanos) FROM usage WHERE key = ? AND started_at >= ?",
        ("alice", 0.0),
    ).fetchall()
    assert any("USING COVERING INDEX usage_key_spend" in str(step) for step in plan), plan
    conn.close()
