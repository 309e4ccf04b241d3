"""What ``Upstream.read_signals`` makes of a replica's ``/metrics`` and ``/load``.

Written for mutation testing (docs/testing.md): the scrape's end-to-end tests see a healthy
simulator, which always answers both; here each is missing, failing or garbled on its own.
"""

from __future__ import annotations

import httpx
import pytest

from tests.unit.test_mut_upstream import Handler, shell

METRICS = (
    b"# HELP vllm:num_requests_waiting Requests waiting.\n"
    b'vllm:num_requests_waiting{model_name="m"} 3.0\n'
    b'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
)


def replica(metrics: int | bytes, load: int | bytes) -> Handler:
    """``/metrics`` and ``/load`` answer with that status, or 200 and those bytes."""

    async def handler(request: httpx.Request) -> httpx.Response:
        answer = {"/metrics": metrics, "/load": load}[request.url.path]
        if isinstance(answer, int):
            return httpx.Response(answer)
        return httpx.Response(200, content=answer)

    return handler


async def test_both_answered() -> None:
    upstream = shell(replica(METRICS, b'{"server_load": 7}'))
    assert await upstream.gate.try_acquire(object())  # one of the gateway's own requests
    signals = await upstream.read_signals()
    assert signals is not None
    assert (signals.waiting, signals.kv_cache_usage) == (3, 0.25)
    assert (signals.load, signals.load_own) == (7, 1)
    assert signals.others_load() == 6


async def test_metrics_without_load() -> None:
    signals = await shell(replica(METRICS, 404)).read_signals()
    assert signals is not None
    assert (signals.waiting, signals.load) == (3, None)


async def test_load_without_metrics() -> None:
    signals = await shell(replica(404, b'{"server_load": 2}')).read_signals()
    assert signals is not None
    assert (signals.waiting, signals.kv_cache_usage, signals.load) == (None, None, 2)


@pytest.mark.parametrize("metrics", [404, 500])
async def test_neither_is_none(metrics: int) -> None:
    assert await shell(replica(metrics, 404)).read_signals() is None


async def test_metrics_that_cannot_be_read_count_as_missing() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            raise httpx.ReadError("reset", request=request)
        return httpx.Response(404)

    assert await shell(handler).read_signals() is None


async def test_bytes_that_are_not_utf8_do_not_lose_the_rest() -> None:
    garbled = b"# HELP \xff\xfe not text\n" + METRICS
    signals = await shell(replica(garbled, 404)).read_signals()
    assert signals is not None and signals.waiting == 3
