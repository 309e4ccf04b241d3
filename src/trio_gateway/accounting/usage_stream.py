"""The usage records as a Redis Stream, for a billing system that reads them with a consumer
group (``[usage] sink = "redis_stream"``; docs/accounting.md#the-redis-stream).

::

    relay.record ──offer()──▶ bounded queue (QueuedSink) ──▶ serve_usage_stream: a batch
      ──▶ one pipelined write of ``XADD STREAM MAXLEN ~ CAP * field value ...`` per record

Each record is one entry whose fields are the record's (docs/accounting.md): strings, numbers
in decimal, ``estimated`` as ``0``/``1``, and a null as the empty string. ``MAXLEN ~`` keeps the
stream near its cap: Redis trims whole macro nodes, so the memory stays bounded without
a trim per entry.

Redis trouble never reaches a request: the queue absorbs what it can (then drops, counted as
``gateway_usage_dropped_total{reason="queue_full"}``); a batch Redis does not take within the
deadline is counted as ``reason="write_failed"`` and logged, and the next batch dials again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from trio_gateway.accounting.ledger import QueuedSink
from trio_gateway.config.schema import GatewayConfig, UsageConfig
from trio_gateway.core.usage import UsageRecord
from trio_gateway.redis.client import RedisClient, RedisError, open_redis
from trio_gateway.redis.url import parse_redis_url

log = logging.getLogger("trio_gateway")

# A batch's write: Redis's own deadline is per call, a batch of batch_max XADDs gets at least this.
MIN_BATCH_TIMEOUT_S = 2.0


def stream_fields(record: UsageRecord) -> dict[str, str]:
    """The XADD fields of one record."""
    out: dict[str, str] = {}
    for name, value in record.as_row().items():
        if value is None:
            text = ""
        elif isinstance(value, bool):
            text = "1" if value else "0"
        else:
            text = str(value)
        out[name] = text
    return out


class RedisStreamSink(QueuedSink):
    def __init__(
        self,
        config: UsageConfig,
        url: str,
        timeout_s: float,
        ca_file: str | None = None,
        cluster: bool = False,
    ) -> None:
        super().__init__(config)
        self.url = url
        self.ca_file = ca_file
        self.cluster = cluster
        self.stream = config.stream
        self.maxlen = config.stream_maxlen
        self.timeout_s = max(timeout_s, MIN_BATCH_TIMEOUT_S)

    async def write(self, client: RedisClient, batch: Sequence[UsageRecord]) -> None:
        await client.append_stream(self.stream, self.maxlen, [stream_fields(r) for r in batch])


async def serve_usage_stream(
    sink: RedisStreamSink, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Write batches to the stream until :meth:`RedisStreamSink.close`.

    The client is this service's own and lives inside the sink's shielded scope: coredis reads
    replies in tasks of the client's task group, and a client entered outside the shield would
    lose its connections the moment the gateway is cancelled, before the queue is written out.
    """
    task_status.started()
    with sink._scope:
        async with open_redis(sink.url, ca_file=sink.ca_file, cluster=sink.cluster) as client:
            async for batch in sink._batches():
                problem = ""
                with trio.move_on_after(sink.timeout_s) as late:
                    try:
                        await sink.write(client, batch)
                        sink._written += len(batch)
                        continue
                    except RedisError as exc:
                        problem = str(exc)
                if late.cancelled_caught:
                    problem = f"no answer within {sink.timeout_s}s"
                sink._dropped_failed += len(batch)
                log.error(
                    "usage stream %s: %d records not written: %s", sink.stream, len(batch), problem
                )


@asynccontextmanager
async def open_usage_stream(config: GatewayConfig) -> AsyncIterator[RedisStreamSink]:
    assert config.redis is not None  # config checks: redis_stream needs [redis]
    async with trio.open_nursery() as nursery:
        redis = config.redis
        sink = RedisStreamSink(
            config.usage, redis.url, redis.timeout_s, ca_file=redis.ca_file, cluster=redis.cluster
        )
        await nursery.start(serve_usage_stream, sink)
        log.info(
            "usage: redis stream %s on %s",
            sink.stream,
            parse_redis_url(config.redis.url).display(),
        )
        try:
            yield sink
        finally:
            sink.close()
