"""``accounting/response_redis.py`` against the real redis-server the suite starts: two owners
(API keys) never see each other's responses or items, the per-key quota drops the oldest use
first, a walk reads a chain back within its bounds and starts each record's TTL over, the TTL
is the config's, and every script's keys are in one Redis Cluster slot (a real cluster node
runs them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.e2e.test_redis_cluster_slots import slot
from tests.redis_server import running_redis
from tests.unit.test_response_store import WIDE, rid, turn
from trio_gateway.accounting.response_records import (
    ChainBounds,
    conversation,
    find_items,
)
from trio_gateway.accounting.response_redis import RedisResponseStore
from trio_gateway.core.errors import ConversationTooLong, ResponseNotFound
from trio_gateway.redis.client import open_redis

TTL_S = 3600.0


@asynccontextmanager
async def redis_store(
    quota: int = 10**9, cluster_dir: str | None = None
) -> AsyncIterator[RedisResponseStore]:
    async with running_redis(cluster_dir=cluster_dir) as server, open_redis(server.url) as client:
        yield RedisResponseStore(client, "t:", ttl_s=TTL_S, key_quota_bytes=quota, timeout_s=5.0)


async def test_one_key_never_reads_another_s() -> None:
    async with redis_store() as store:
        await store.put("alice", turn(1))
        await store.put("alice", turn(2, 1))
        await store.put("bob", turn(3))
        item = f"msg_{2:032x}_0"
        assert await store.get("bob", rid(2)) is None
        assert (await store.chain("bob", rid(2), WIDE)).records == ()
        with pytest.raises(ResponseNotFound):
            await conversation([store], "bob", rid(2), WIDE)
        assert await find_items([store], "bob", [item], WIDE) == {}
        assert not await store.delete("bob", rid(2))
        # Alice's are all there, and bob's own.
        assert [r.id for r in await conversation([store], "alice", rid(2), WIDE)] == [
            rid(1),
            rid(2),
        ]
        assert list(await find_items([store], "alice", [item], WIDE)) == [item]
        assert await store.get("bob", rid(3)) is not None
        assert await store.get("alice", rid(3)) is None
        assert await store.owner_bytes("alice") == turn(1).size + turn(2, 1).size
        assert await store.owner_bytes("bob") == turn(3).size
        assert await store.delete("alice", rid(2))
        assert await store.owner_bytes("alice") == turn(1).size


async def test_the_quota_drops_a_key_s_oldest_use_first() -> None:
    size = turn(1).size
    async with redis_store(quota=3 * size) as store:
        await store.put("bob", turn(100))
        for n in range(1, 4):
            await store.put("alice", turn(n))
        await store.chain("alice", rid(1), WIDE)  # used again: now the newest use
        await store.put("alice", turn(4))
        present = [n for n in range(1, 5) if await store.get("alice", rid(n)) is not None]
        assert present == [1, 3, 4]
        assert await store.owner_bytes("alice") == 3 * size
        assert await store.get("bob", rid(100)) is not None


async def test_a_walk_within_bounds_and_the_ttl_it_starts_over() -> None:
    async with redis_store() as store:
        for n in range(1, 6):
            await store.put("", turn(n, n - 1 if n > 1 else None))
        assert [r.id for r in await conversation([store], "", rid(5), WIDE)] == [
            rid(n) for n in range(1, 6)
        ]
        with pytest.raises(ConversationTooLong):
            await conversation([store], "", rid(5), ChainBounds(max_turns=4, max_bytes=10**9))
        records, _ = store._owner_keys("")
        raw = store._client._redis
        await raw.pexpire(records + rid(1), 5000)
        await store.chain("", rid(2), WIDE)
        # The config's TTL, started over by the walk.
        ttl_ms = await raw.pttl(records + rid(1))
        assert TTL_S * 1000 - 60_000 < ttl_ms <= TTL_S * 1000


async def test_every_script_s_keys_are_in_one_slot_on_a_cluster_node(tmp_path: Path) -> None:
    quota = 3 * turn(2, 1).size
    async with redis_store(quota=quota, cluster_dir=str(tmp_path)) as store:
        for owner in ("alice", "bob"):
            keys = store.keys(owner, rid(1))
            assert len({slot(k) for k in keys}) == 1, keys
            for n in range(1, 6):
                await store.put(owner, turn(n, n - 1 if n > 1 else None))  # evicts the oldest
            assert await store.get(owner, rid(1)) is None
            part = await store.chain(owner, rid(5), WIDE)
            assert [r.id for r in part.records] == [rid(5), rid(4), rid(3)]
            assert part.next == rid(2)  # evicted by the quota: the walk stops there
            assert await store.delete(owner, rid(5))
        assert slot(store.keys("alice", rid(1))[0]) != slot(store.keys("bob", rid(1))[0])


async def test_many_writers_at_once_keep_the_key_s_count_true() -> None:
    size = turn(1, 0).size
    async with redis_store(quota=20 * size) as store:

        async def writer(k: int) -> None:
            previous = None
            for step in range(5):
                n = k * 100 + step
                await store.put("alice", turn(n, previous))
                previous = n

        async with trio.open_nursery() as nursery:
            for k in range(30):
                nursery.start_soon(writer, k)
        records, (index, sizes, _) = store._owner_keys("alice")
        raw = store._client._redis
        ids = [i.decode() for i in await raw.zrange(index, 0, -1)]
        held = [int(await raw.hget(records + i, "bytes") or 0) for i in ids]
        assert all(held) and len(ids) == len(await raw.hkeys(sizes))
        assert await store.owner_bytes("alice") == sum(held) <= 20 * size
