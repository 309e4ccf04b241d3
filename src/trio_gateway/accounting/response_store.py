"""Stored responses (``POST /v1/responses`` with ``store``, the API's default): what a later
request's ``previous_response_id`` continues from, and ``GET``/``DELETE /v1/responses/{id}``.

Each record is one response object and the conversation's items up to it (every input and
output item, oldest first), kept for ``[responses] store_ttl_s`` under its owner: the API key's
name (``""`` when the gateway serves without keys). A lookup names the owner, so a key never
reads, continues or deletes another key's responses: to it they do not exist.

Where they are kept, by the config:

- ``[redis]`` configured: Redis (``<key_prefix>resp:<owner hash>:<id>``, with Redis's own
  expiry), shared by every worker and replica;
- else the usage ledger's directory, when the ledger is a file: the SQLite file
  ``trio-gateway-responses.sqlite3`` there (shared by the workers of one machine);
- else (no ledger file: ``ledger = "none"``, ``":memory:"``, or a config not read from a file):
  in the process's memory, the newest ``memory_max_responses`` (per worker process).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

import trio

from trio_gateway.config.schema import GatewayConfig
from trio_gateway.redis.client import RedisClient, RedisError

RESPONSES_FILE: Final = "trio-gateway-responses.sqlite3"
# Expired rows are swept every this many writes (a lookup never returns one either way).
SWEEP_EVERY: Final = 500

Record = dict[str, Any]
Clock = Callable[[], float]


class StoreError(Exception):
    """The store could not answer (Redis down or slow, the file unwritable)."""


class ResponseStore(Protocol):
    async def put(self, owner: str, response_id: str, record: Record) -> None: ...

    async def get(self, owner: str, response_id: str) -> Record | None: ...

    async def delete(self, owner: str, response_id: str) -> bool: ...


def _dump(record: Record) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


class MemoryResponseStore:
    """The newest ``max_responses`` records, in this process."""

    def __init__(self, ttl_s: float, max_responses: int, clock: Clock = time.time) -> None:
        self._ttl_s = ttl_s
        self._max = max_responses
        self._clock = clock
        self._records: OrderedDict[tuple[str, str], tuple[float, str]] = OrderedDict()

    async def put(self, owner: str, response_id: str, record: Record) -> None:
        # Kept as text: a stored record is never changed by what its caller does next.
        self._records[(owner, response_id)] = (self._clock() + self._ttl_s, _dump(record))
        self._records.move_to_end((owner, response_id))
        while len(self._records) > self._max:
            self._records.popitem(last=False)

    async def get(self, owner: str, response_id: str) -> Record | None:
        found = self._records.get((owner, response_id))
        if found is None:
            return None
        expires, text = found
        if expires <= self._clock():
            del self._records[(owner, response_id)]
            return None
        record: Record = json.loads(text)
        return record

    async def delete(self, owner: str, response_id: str) -> bool:
        if await self.get(owner, response_id) is None:
            return False
        del self._records[(owner, response_id)]
        return True


_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    expires_at REAL NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (owner, id)
)
"""


class SQLiteResponseStore:
    """Records in a SQLite file, read and written from a worker thread, one call at a time."""

    def __init__(self, path: str, ttl_s: float, clock: Clock = time.time) -> None:
        self.path = path
        self._ttl_s = ttl_s
        self._clock = clock
        self._conn: sqlite3.Connection | None = None
        self._lock = trio.Lock()
        self._writes = 0

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=5000")
            conn.execute(_SCHEMA)
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        async with self._lock:
            try:
                return await trio.to_thread.run_sync(lambda: fn(self._connection()))
            except sqlite3.Error as exc:
                raise StoreError(f"the responses file {self.path}: {exc}") from exc

    async def put(self, owner: str, response_id: str, record: Record) -> None:
        now = self._clock()
        self._writes += 1
        sweep = self._writes % SWEEP_EVERY == 0
        body = _dump(record)

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
                (owner, response_id, now + self._ttl_s, body),
            )
            if sweep:
                conn.execute("DELETE FROM responses WHERE expires_at <= ?", (now,))

        await self._run(write)

    async def get(self, owner: str, response_id: str) -> Record | None:
        now = self._clock()

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                "SELECT body FROM responses WHERE owner = ? AND id = ? AND expires_at > ?",
                (owner, response_id, now),
            ).fetchone()

        row = await self._run(read)
        if row is None:
            return None
        record: Record = json.loads(row[0])
        return record

    async def delete(self, owner: str, response_id: str) -> bool:
        now = self._clock()

        def remove(conn: sqlite3.Connection) -> int:
            cursor = conn.execute(
                "DELETE FROM responses WHERE owner = ? AND id = ? AND expires_at > ?",
                (owner, response_id, now),
            )
            return cursor.rowcount

        return bool(await self._run(remove))

    async def aclose(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await trio.to_thread.run_sync(conn.close)


_PUT = "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1"
_GET = "return redis.call('GET', KEYS[1])"
_DELETE = "return redis.call('DEL', KEYS[1])"


class RedisResponseStore:
    """Records in Redis, each under its owner's hash, expiring by Redis's clock."""

    def __init__(self, client: RedisClient, prefix: str, ttl_s: float, timeout_s: float) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._timeout_s = timeout_s

    def _key(self, owner: str, response_id: str) -> str:
        tag = hashlib.sha256(owner.encode()).hexdigest()[:16]
        return f"{self._prefix}resp:{tag}:{response_id}"

    async def _call(self, script: str, key: str, args: list[str | int]) -> object:
        try:
            with trio.fail_after(self._timeout_s):
                return await self._client.run_script(script, [key], args)
        except (RedisError, trio.TooSlowError) as exc:
            raise StoreError(f"Redis did not answer: {exc or 'timed out'}") from exc

    async def put(self, owner: str, response_id: str, record: Record) -> None:
        await self._call(_PUT, self._key(owner, response_id), [_dump(record), self._ttl_ms])

    async def get(self, owner: str, response_id: str) -> Record | None:
        reply = await self._call(_GET, self._key(owner, response_id), [])
        if reply is None:
            return None
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        record: Record = json.loads(text)
        return record

    async def delete(self, owner: str, response_id: str) -> bool:
        return bool(await self._call(_DELETE, self._key(owner, response_id), []))


def open_response_store(
    config: GatewayConfig, ledger: str | None, redis: RedisClient | None
) -> ResponseStore:
    """The store the config asks for (see the module's docstring); ``ledger`` is the usage
    ledger's path (``accounting.ledger.ledger_path``)."""
    settings = config.responses
    if config.redis is not None and redis is not None:
        # Responses outlast a turn: a second's wait is better than a continuation lost.
        timeout = max(config.redis.timeout_s, 1.0)
        return RedisResponseStore(redis, config.redis.key_prefix, settings.store_ttl_s, timeout)
    if ledger is not None and ledger != ":memory:":
        path = str(Path(ledger).parent / RESPONSES_FILE)
        return SQLiteResponseStore(path, settings.store_ttl_s)
    return MemoryResponseStore(settings.store_ttl_s, settings.memory_max_responses)
