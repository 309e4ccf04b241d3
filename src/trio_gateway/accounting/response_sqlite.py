"""Stored responses in a SQLite file (``trio-gateway-responses.sqlite3`` beside the usage
ledger), shared by the workers of one machine; read and written from a worker thread, one call
at a time per process.

The schema (``PRAGMA user_version`` 2)::

    response_records(owner, id, previous, expires_at, bytes, body)  -- one row per turn
        PRIMARY KEY (owner, id); INDEX (owner, expires_at)
    response_owners(owner, bytes)  -- each owner's bytes, kept by triggers on insert and delete

``body`` is the record's text (``response_records.Stored``), ``bytes`` its size: a walk reads
``previous`` and ``bytes`` first, and the bodies only once the chain is known to be within its
bounds. A file of the first layout (version 0: ``responses(owner, id, expires_at, body)``, each
body the response and the whole conversation up to it) is migrated when it is opened: each row
becomes a record whose input is the conversation before its output, with no predecessor, so
every stored response can still be continued and read; then that table is dropped.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import trio

from trio_gateway.accounting.response_records import (
    Chain,
    ChainBounds,
    Record,
    Stored,
    StoreError,
    fits,
    load_record,
)
from trio_gateway.accounting.sqlite_file import use_wal

Clock = Callable[[], float]

SCHEMA_VERSION: Final = 2
# Expired rows of every owner are swept every this many writes (an owner's own at each of its
# writes; a lookup never returns one either way).
SWEEP_EVERY: Final = 500

_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS response_records (
        owner TEXT NOT NULL,
        id TEXT NOT NULL,
        previous TEXT,
        expires_at REAL NOT NULL,
        bytes INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (owner, id)
    )""",
    "CREATE INDEX IF NOT EXISTS response_records_age ON response_records (owner, expires_at)",
    """CREATE TABLE IF NOT EXISTS response_owners (
        owner TEXT PRIMARY KEY,
        bytes INTEGER NOT NULL
    )""",
    """CREATE TRIGGER IF NOT EXISTS response_records_in AFTER INSERT ON response_records BEGIN
        INSERT INTO response_owners VALUES (new.owner, new.bytes)
            ON CONFLICT (owner) DO UPDATE SET bytes = bytes + new.bytes;
    END""",
    """CREATE TRIGGER IF NOT EXISTS response_records_out AFTER DELETE ON response_records BEGIN
        UPDATE response_owners SET bytes = bytes - old.bytes WHERE owner = old.owner;
    END""",
)


def _migrate(conn: sqlite3.Connection, now: float, ttl_s: float) -> None:
    """Brings the file to :data:`SCHEMA_VERSION`, in a transaction that holds the write lock:
    once, whichever process gets there first."""
    if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
        return
    for statement in _SCHEMA:
        conn.execute(statement)
    old = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'responses'"
    ).fetchone()
    if old is not None:
        _migrate_first_layout(conn, now, ttl_s)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _migrate_first_layout(conn: sqlite3.Connection, now: float, ttl_s: float) -> None:
    rows = conn.execute(
        "SELECT owner, id, expires_at, body FROM responses WHERE expires_at > ?", (now,)
    )
    # Row by row: a file of that layout may hold hundreds of MB.
    for owner, response_id, expires_at, body in rows:
        old = json.loads(body)
        response: dict[str, Any] = old["response"]
        items: list[dict[str, Any]] = old.get("items") or []
        output = response.get("output") or []
        before = items[: len(items) - len(output)] if output else items
        record = Record(id=response_id, previous=None, response=response, input=before)
        stored = Stored.of(record)
        conn.execute(
            "INSERT OR IGNORE INTO response_records VALUES (?, ?, NULL, ?, ?, ?)",
            (owner, response_id, min(expires_at, now + ttl_s), stored.size, stored.text),
        )
    conn.execute("DROP TABLE responses")


def _transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], Any]) -> Any:
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def _oldest(conn: sqlite3.Connection, owner: str, excess: int) -> list[str]:
    """The owner's records of the oldest use whose bytes make up ``excess``."""
    cursor = conn.execute(
        "SELECT id, bytes FROM response_records WHERE owner = ? ORDER BY expires_at", (owner,)
    )
    gone = []
    for response_id, size in cursor:
        gone.append(response_id)
        excess -= size
        if excess <= 0:
            break
    cursor.close()
    return gone


class SQLiteResponseStore:
    """Records in a SQLite file, within ``key_quota_bytes`` per owner (oldest use first out)."""

    def __init__(
        self, path: str, *, ttl_s: float, key_quota_bytes: int, clock: Clock = time.time
    ) -> None:
        self.path = path
        self._ttl_s = ttl_s
        self._key_quota_bytes = key_quota_bytes
        self._clock = clock
        self._conn: sqlite3.Connection | None = None
        self._lock = trio.Lock()
        self._writes = 0

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            try:
                use_wal(conn)
                if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                    _transaction(conn, lambda c: _migrate(c, self._clock(), self._ttl_s))
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], Any], *, writes: bool = True) -> Any:
        """``fn`` off the loop; one that ``writes`` in one transaction that takes the file's
        write lock at once (one that read first and wrote later could deadlock with another
        process's writer)."""

        def run() -> Any:
            conn = self._connection()
            return _transaction(conn, fn) if writes else fn(conn)

        async with self._lock:
            try:
                return await trio.to_thread.run_sync(run)
            except sqlite3.Error as exc:
                raise StoreError(f"the responses file {self.path}: {exc}") from exc

    async def put(self, owner: str, stored: Stored) -> None:
        now = self._clock()
        self._writes += 1
        sweep = self._writes % SWEEP_EVERY == 0

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM response_records WHERE owner = ? AND (expires_at <= ? OR id = ?)",
                (owner, now, stored.id),
            )
            if sweep:
                conn.execute("DELETE FROM response_records WHERE expires_at <= ?", (now,))
                conn.execute("DELETE FROM response_owners WHERE bytes <= 0")
            held = conn.execute(
                "SELECT bytes FROM response_owners WHERE owner = ?", (owner,)
            ).fetchone()
            excess = (held[0] if held is not None else 0) + stored.size - self._key_quota_bytes
            if excess > 0:
                conn.executemany(
                    "DELETE FROM response_records WHERE owner = ? AND id = ?",
                    [(owner, one) for one in _oldest(conn, owner, excess)],
                )
            conn.execute(
                "INSERT INTO response_records VALUES (?, ?, ?, ?, ?, ?)",
                (owner, stored.id, stored.previous, now + self._ttl_s, stored.size, stored.text),
            )

        await self._run(write)

    async def get(self, owner: str, response_id: str) -> Record | None:
        now = self._clock()

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                "SELECT body FROM response_records WHERE owner = ? AND id = ? AND expires_at > ?",
                (owner, response_id, now),
            ).fetchone()

        row = await self._run(read, writes=False)
        return None if row is None else load_record(response_id, row[0])

    async def chain(self, owner: str, response_id: str, bounds: ChainBounds) -> Chain:
        now = self._clock()

        def walk(conn: sqlite3.Connection) -> Chain:
            ids: list[str] = []
            size = 0
            wanted: str | None = response_id
            while wanted is not None:
                row = conn.execute(
                    "SELECT previous, bytes FROM response_records "
                    "WHERE owner = ? AND id = ? AND expires_at > ?",
                    (owner, wanted, now),
                ).fetchone()
                if row is None:
                    break
                if not fits(len(ids), size, row[1], bounds):
                    return Chain(next=wanted, over=True)
                ids.append(wanted)
                size += row[1]
                wanted = row[0]
            records = []
            for one in ids:
                (body,) = conn.execute(
                    "SELECT body FROM response_records WHERE owner = ? AND id = ?", (owner, one)
                ).fetchone()
                records.append(load_record(one, body))
            conn.executemany(
                "UPDATE response_records SET expires_at = ? WHERE owner = ? AND id = ?",
                [(now + self._ttl_s, owner, one) for one in ids],
            )
            return Chain(records=tuple(records), size=size, next=wanted)

        chain: Chain = await self._run(walk)
        return chain

    async def delete(self, owner: str, response_id: str) -> bool:
        now = self._clock()

        def remove(conn: sqlite3.Connection) -> int:
            cursor = conn.execute(
                "DELETE FROM response_records WHERE owner = ? AND id = ? AND expires_at > ?",
                (owner, response_id, now),
            )
            return cursor.rowcount

        return bool(await self._run(remove))

    async def owner_bytes(self, owner: str) -> int:
        """What the owner's records hold, expired ones not yet swept included."""

        def read(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT bytes FROM response_owners WHERE owner = ?", (owner,)
            ).fetchone()
            return int(row[0]) if row is not None else 0

        held: int = await self._run(read, writes=False)
        return held

    async def aclose(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await trio.to_thread.run_sync(conn.close)
