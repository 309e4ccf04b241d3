"""Reading what vLLM replicas say of their own load, every ``scrape_interval_s``.

The signals (``providers/vllm_signals.py``) refine ``least_loaded`` routing and give the gateway's
``/metrics`` the prefix-cache hit rate per provider and replica. A scrape that fails leaves the
last signals standing and says nothing of health: readiness is the probe's business.
"""

from __future__ import annotations

import logging

import trio

from trio_gateway.providers.upstream import Upstream

log = logging.getLogger("trio_gateway")


async def scrape_service(
    upstream: Upstream, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    task_status.started()
    while True:
        signals = await upstream.read_signals()
        if signals is not None:
            upstream.signals = signals
            upstream.prefix_cache.update(signals)
        await trio.sleep(upstream.config.scrape_interval_s)
