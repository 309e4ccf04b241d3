"""The money path's Redis side to the letter, on a real redis-server: the usage stream's
service (what it writes and counts, what it logs when Redis fails, TLS and a cluster), and the
hold TTL the budget script is given (mutation testing, docs/testing.md)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import coredis
import pytest
import trio

from tests.redis_server import pause, resume, running_redis, running_redis_cluster
from tests.unit.test_h1_client_tls import make_ca_and_server
from trio_gateway.accounting import usage_stream
from trio_gateway.accounting.limit_store import AdmitArgs, RedisStore
from trio_gateway.accounting.usage_stream import RedisStreamSink, serve_usage_stream
from trio_gateway.config.schema import UsageConfig
from trio_gateway.core.usage import UsageRecord
from trio_gateway.redis.client import RedisClient, open_redis

TIMEOUT_S = 20


def record(n: int, *, estimated: bool = False) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{n}",
        key="alice",
        alias="a",
        provider=None,
        outcome="completed",
        completion_tokens=n,
        estimated=estimated,
        started_at=1.5,
    )


async def write_out(sink: RedisStreamSink, records: list[UsageRecord]) -> None:
    """Offer ``records``, close the sink and wait for its service to end."""
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_usage_stream, sink)
            for r in records:
                assert sink.offer(r)
            sink.close()


def config(stream: str = "s", batch_max: int = 2) -> UsageConfig:
    return UsageConfig(
        sink="redis_stream", stream=stream, batch_max=batch_max, flush_interval_s=0.01
    )


async def test_every_batch_is_written_and_counted() -> None:
    async with running_redis() as redis:
        sink = RedisStreamSink(config(), redis.url, timeout_s=1.0)
        await write_out(sink, [record(1), record(2, estimated=True), record(3)])
        async with coredis.Redis.from_url(redis.url) as raw:
            entries = await raw.xrange("s")
    stats = sink.statistics()
    assert (stats.written, stats.dropped_write_failed) == (3, 0)
    fields = [dict(e.field_values) for e in entries]
    assert [f[b"request_id"] for f in fields] == [b"r1", b"r2", b"r3"]
    assert [f[b"estimated"] for f in fields] == [b"0", b"1", b"0"]
    assert fields[0][b"provider"] == b"" and fields[0][b"started_at"] == b"1.5"


async def test_a_write_redis_refuses_is_counted_and_logged_with_its_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_redis() as redis:
        async with coredis.Redis.from_url(redis.url) as raw:
            await raw.set("s", "not a stream")
        sink = RedisStreamSink(config(), redis.url, timeout_s=1.0)
        with caplog.at_level(logging.ERROR, logger="trio_gateway"):
            await write_out(sink, [record(1), record(2), record(3)])
    stats = sink.statistics()
    assert (stats.written, stats.dropped_write_failed) == (0, 3)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("usage stream s: 2 records not written: ")
    assert "wrong kind of value" in lines[0]
    assert lines[1].startswith("usage stream s: 1 records not written: ")


class _Signalling(RedisStreamSink):
    """A sink that says when a batch was written."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wrote = trio.Event()

    async def write(self, client: RedisClient, batch: Sequence[UsageRecord]) -> None:
        await super().write(client, batch)
        self.wrote.set()


async def test_a_redis_that_does_not_answer_costs_a_batch_its_deadline(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usage_stream, "MIN_BATCH_TIMEOUT_S", 0.2)
    async with running_redis() as redis:
        sink = _Signalling(config(batch_max=5), redis.url, timeout_s=0.1)
        assert sink.timeout_s == 0.2
        with caplog.at_level(logging.ERROR, logger="trio_gateway"), trio.fail_after(TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_usage_stream, sink)
                # The first batch dials and is written; then the server stops answering.
                sink.offer(record(1))
                await sink.wrote.wait()
                pause(redis)
                sink.offer(record(2))
                sink.offer(record(3))
                sink.close()
        resume(redis)
    assert sink.statistics().dropped_write_failed == 2
    assert [r.getMessage() for r in caplog.records if r.name == "trio_gateway"] == [
        "usage stream s: 2 records not written: no answer within 0.2s"
    ]


async def test_the_stream_is_written_over_tls_with_the_configured_ca(tmp_path: Path) -> None:
    ca, _ = make_ca_and_server(tmp_path)
    tls = (str(tmp_path / "server.pem"), str(ca))
    async with running_redis(tls=tls) as redis:
        sink = RedisStreamSink(config(), redis.url, timeout_s=1.0, ca_file=str(ca))
        await write_out(sink, [record(1)])
        async with open_redis(redis.url, ca_file=str(ca)) as client:
            assert await client._redis.xlen("s") == 1
    assert sink.statistics().written == 1


async def test_the_stream_is_written_on_the_node_of_its_slot_in_a_cluster(
    tmp_path: Path,
) -> None:
    # "{u}" hashes to slot 11694: the third of three nodes, not the one dialled.
    async with running_redis_cluster(tmp_path) as server:
        sink = RedisStreamSink(config("{u}s"), server.url, timeout_s=1.0, cluster=True)
        await write_out(sink, [record(1), record(2)])
        async with open_redis(server.url, cluster=True) as client:
            assert await client._redis.xlen("{u}s") == 2
    assert sink.statistics().written == 2


async def test_a_hold_lives_its_ttl_in_milliseconds() -> None:
    async with running_redis() as redis, open_redis(redis.url) as client:
        store = RedisStore(client, "t:")
        args = AdmitArgs(
            key="k", rpm=None, tpm=None, tokens=1, budget=100, hold=5, hold_id="h", ttl_s=1000.0
        )
        assert (await store.admit(args)).refused is None
        ttl_ms = [await client._redis.pttl(k) for k in ("t:holds:{k}", "t:holdexp:{k}")]
    assert all(999_000 < ttl <= 1_000_000 for ttl in ttl_ms), ttl_ms
