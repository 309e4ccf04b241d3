"""Where usage records go: the ledger file, the Redis stream, or nowhere, as the config says."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from trio_gateway.accounting.ledger import LEDGER_MEMORY, SQLiteLedger, ledger_path, serve_ledger
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.core.usage import NULL_SINK, UsageSink

log = logging.getLogger("trio_gateway")


@asynccontextmanager
async def open_usage_sink(config: GatewayConfig) -> AsyncIterator[UsageSink]:
    """The sink ``config`` chooses, its service running; on exit, the queue is written out."""
    if config.usage.sink == "none":
        yield NULL_SINK
        return
    if config.usage.sink == "redis_stream":
        # Imported here: the stream sink is the only user of the Redis client in this module.
        from trio_gateway.accounting.usage_stream import open_usage_stream

        async with open_usage_stream(config) as stream:
            yield stream
        return
    path = ledger_path(config)
    if path is None:
        yield NULL_SINK
        return
    if config.usage.ledger is None and path != LEDGER_MEMORY:
        folder = Path(path).parent
        if not os.access(folder, os.W_OK):
            # The default must start anywhere: a read-only config directory keeps records in
            # memory (a path given in [usage] is not second-guessed: it fails loudly).
            log.warning("usage ledger: %s is not writable; records kept in memory only", folder)
            path = LEDGER_MEMORY
    ledger = SQLiteLedger(path, config.usage)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_ledger, ledger)
        log.info("usage ledger: %s", path)
        try:
            yield ledger
        finally:
            ledger.close()
