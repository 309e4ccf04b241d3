"""Stored responses (``POST /v1/responses`` with ``store``, the API's default): what a later
request's ``previous_response_id`` continues from, what an ``item_reference`` names, and ``GET``/
``DELETE /v1/responses/{id}``. What a record is and how a conversation is read back:
``response_records.py``.

Where they are kept, by the config (each within ``[responses]`` ``store_ttl_s`` from a record's
last use, and ``key_quota_bytes`` per API key, oldest use first out):

- ``[redis]`` configured: Redis (``response_redis.py``), shared by every worker and replica;
- else the usage ledger's directory, when the ledger is a file: the SQLite file
  ``trio-gateway-responses.sqlite3`` there (``response_sqlite.py``; shared by the workers of
  one machine);
- else (no ledger file: ``ledger = "none"``, ``":memory:"``, or a config not read from a file):
  in the process's memory (``response_memory.py``), within ``memory_max_bytes`` and
  ``memory_max_responses`` per worker process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from trio_gateway.accounting.response_memory import MemoryResponseStore
from trio_gateway.accounting.response_records import ChainBounds, ResponseStore
from trio_gateway.accounting.response_redis import RedisResponseStore
from trio_gateway.accounting.response_sqlite import SQLiteResponseStore
from trio_gateway.config.schema import GatewayConfig, ResponsesConfig
from trio_gateway.redis.client import RedisClient

RESPONSES_FILE: Final = "trio-gateway-responses.sqlite3"


def chain_bounds(settings: ResponsesConfig) -> ChainBounds:
    return ChainBounds(max_turns=settings.max_chain_turns, max_bytes=settings.max_chain_bytes)


def memory_store(settings: ResponsesConfig) -> MemoryResponseStore:
    return MemoryResponseStore(
        ttl_s=settings.store_ttl_s,
        max_bytes=settings.memory_max_bytes,
        key_quota_bytes=settings.key_quota_bytes,
        max_responses=settings.memory_max_responses,
    )


def open_response_store(
    config: GatewayConfig, ledger: str | None, redis: RedisClient | None
) -> ResponseStore:
    """The store the config asks for (see the module's docstring); ``ledger`` is the usage
    ledger's path (``accounting.ledger.ledger_path``)."""
    settings = config.responses
    if config.redis is not None and redis is not None:
        return RedisResponseStore(
            redis,
            config.redis.key_prefix,
            ttl_s=settings.store_ttl_s,
            key_quota_bytes=settings.key_quota_bytes,
            # Responses outlast a turn: a second's wait is better than a continuation lost.
            timeout_s=max(config.redis.timeout_s, 1.0),
        )
    if ledger is not None and ledger != ":memory:":
        return SQLiteResponseStore(
            str(Path(ledger).parent / RESPONSES_FILE),
            ttl_s=settings.store_ttl_s,
            key_quota_bytes=settings.key_quota_bytes,
        )
    return memory_store(settings)
