"""``accounting/sqlite_file.py``: a second process opening a file that another is writing
waits for it rather than failing (two workers opening the ledger or the responses file)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from trio_gateway.accounting.sqlite_file import use_wal


def writing(path: Path) -> tuple[sqlite3.Connection, threading.Event]:
    """A connection in the middle of a write (its RESERVED lock held) on a new file, and the
    event that lets it commit."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE t (a)")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t VALUES (1)")
    return conn, threading.Event()


def test_the_switch_to_wal_waits_for_another_writer(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    writer, go = writing(path)

    def commit_once_the_other_tried() -> None:
        go.wait()
        writer.execute("COMMIT")

    thread = threading.Thread(target=commit_once_the_other_tried)
    thread.start()
    other = sqlite3.connect(path, isolation_level=None)
    # SQLite answers the bare pragma "locked" at once, whatever the busy timeout: the lock
    # it needs would deadlock with the writer's.
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        other.execute("PRAGMA journal_mode=WAL")
    # The writer commits while use_wal is retrying.
    threading.Timer(0.05, go.set).start()
    use_wal(other)
    thread.join()
    assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert other.execute("SELECT a FROM t").fetchall() == [(1,)]


def test_a_lock_held_past_the_timeout_still_fails(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    writer, _ = writing(path)
    other = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        use_wal(other, timeout_s=0.05)
    writer.execute("ROLLBACK")
