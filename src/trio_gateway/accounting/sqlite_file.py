"""Opening an SQLite file that several processes share (the workers of a host, a restart that
overlaps the old process): the ledger and the responses file. Blocking: call from a thread."""

from __future__ import annotations

import sqlite3
import time
from typing import Final

# How long a statement waits for another process's lock before it fails.
BUSY_TIMEOUT_S: Final = 5.0
# Turning a file to WAL takes its lock: a second opener retries, with this first pause.
WAL_RETRY_FIRST_S: Final = 0.005


def use_wal(conn: sqlite3.Connection, *, timeout_s: float = BUSY_TIMEOUT_S) -> None:
    """The wait for a lock first, then the file in WAL mode.

    Switching to WAL needs the file's exclusive lock, and SQLite may answer SQLITE_BUSY at
    once rather than through the busy handler while another connection opens the same new
    file: two workers starting together did. So the switch is retried within ``timeout_s``; a
    file already in WAL (the mode is kept in the file) is only read."""
    conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
    deadline = time.monotonic() + timeout_s
    pause = WAL_RETRY_FIRST_S
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)  # a worker thread: another process holds the lock
        pause = min(pause * 2, 0.2)
