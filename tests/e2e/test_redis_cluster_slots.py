"""Every Lua script the gateway runs works on a Redis Cluster: a real redis-server in cluster
mode (one node, every slot) refuses a script whose keys are in different slots (CROSSSLOT),
and each script's keys are also hashed here (CRC16, as the cluster does) to one slot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tests.redis_server import running_redis, running_redis_cluster
from trio_gateway.accounting.limit_store import AdmitArgs, RedisStore
from trio_gateway.capacity.gate import LeaseBroker
from trio_gateway.redis.client import RedisClient, Value, open_redis


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), Redis Cluster's key hash."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def slot(key: str) -> int:
    """The key's slot: only its hash tag (between the first ``{`` and the next ``}``, when
    not empty) is hashed."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key.encode()) % 16384


def test_the_slot_function_is_redis_s() -> None:
    # From the Redis Cluster specification and CLUSTER KEYSLOT.
    assert crc16(b"123456789") == 0x31C3
    assert slot("{user1000}.following") == slot("{user1000}.followers")
    assert slot("foo{}{bar}") == crc16(b"foo{}{bar}") % 16384
    assert slot("foo{{bar}}zap") == slot("{bar")


class Recording(RedisClient):
    """The real client, with every script's keys written down."""

    def __init__(self, inner: RedisClient) -> None:
        super().__init__(inner._redis)
        self.calls: list[list[str]] = []

    async def run_script(self, source: str, keys: Sequence[str], args: Sequence[Value]) -> object:
        self.calls.append(list(keys))
        return await super().run_script(source, keys, args)


async def test_every_script_s_keys_are_in_one_slot_on_a_real_cluster(tmp_path: Path) -> None:
    async with (
        running_redis(cluster_dir=str(tmp_path)) as server,
        open_redis(server.url) as inner,
    ):
        client = Recording(inner)
        broker = LeaseBroker(
            client, key_prefix="tgw:", lease_ttl_s=5, timeout_s=5, on_error="refuse"
        )
        gates = [broker.gate("vllm", 2), broker.gate("vllm@10.0.0.7:8000", 1)]
        held = object()
        for gate in gates:
            assert await gate.try_acquire(held)
        await broker._renew()
        for gate in gates:
            await gate.release(held)
        assert broker.errors == 0  # a CROSSSLOT refusal would be counted here
        store = RedisStore(client, prefix="tgw:")
        for key in ("alice", "bob"):
            args = AdmitArgs(
                key=key, rpm=10, tpm=1000, tokens=5, budget=100, hold=7, hold_id="h1", ttl_s=60
            )
            assert (await store.admit(args)).refused is None
            assert await store.live_holds(key) == 1
            await store.settle(key, "h1", 3)
            assert await store.spent(key) == 3
        # Every script ran (none refused), and its keys hash to one slot each, as the
        # cluster itself hashes them.
        assert len(client.calls) == 2 + 2 + 2 + 2 * 2
        for keys in client.calls:
            assert len({slot(k) for k in keys}) == 1, keys
            for k in keys:
                assert await inner._redis.cluster_keyslot(k) == slot(k)
        # Different API keys still spread over the cluster.
        assert slot(store._keys("alice")[0]) != slot(store._keys("bob")[0])


async def test_leases_limits_and_usage_on_a_three_node_cluster(tmp_path: Path) -> None:
    """``[redis] cluster = true``: each script goes to the node of its keys' slot; API keys
    whose slots are on different nodes are admitted and settled, leases and the usage stream
    work, and nothing is refused as MOVED or CROSSSLOT."""
    async with (
        running_redis_cluster(tmp_path) as server,
        open_redis(server.url, cluster=True) as client,
    ):
        store = RedisStore(client, prefix="tgw:")
        keys = ["alice", "bob", "carol", "dave"]
        nodes = {slot(store._keys(key)[0]) * 3 // 16384 for key in keys}
        assert len(nodes) > 1  # the keys' slots are on different nodes
        for key in keys:
            args = AdmitArgs(
                key=key, rpm=10, tpm=1000, tokens=5, budget=100, hold=7, hold_id="h", ttl_s=60
            )
            assert (await store.admit(args)).refused is None
            await store.settle(key, "h", 4)
            assert await store.spent(key) == 4
            assert await store.live_holds(key) == 0
        broker = LeaseBroker(
            client, key_prefix="tgw:", lease_ttl_s=5, timeout_s=5, on_error="refuse"
        )
        gate = broker.gate("vllm", 1)
        first, second = object(), object()
        assert await gate.try_acquire(first)
        assert not await gate.try_acquire(second)
        await broker._renew()
        await gate.release(first)
        assert broker.errors == 0
        await client.append_stream("tgw:usage", 100, [{"key": "alice"}, {"key": "bob"}])
        assert await client._redis.xlen("tgw:usage") == 2
