"""The export of the gateway's spans never costs a request anything (issue 44): a collector
that is down, or that takes seconds per export, leaves answers as fast as without one; the
spans it could not take are dropped and counted on /metrics. And with tracing off, the SDK is
not even imported."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import httpx
import pytest
import trio

from tests.e2e.harness import (
    FAST_SIM,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    wait_until,
)
from tests.e2e.nginx import free_port
from tests.e2e.test_admission import metric, scrape_when
from tests.otlp_receiver import running_receiver
from trio_gateway.config.load import parse_config

REQUESTS = 12
# Small bounds, so that a dozen requests overflow them.
BOUNDS = "max_queued_spans = 4\nmax_batch_spans = 2\nexport_interval_s = 0.05\n"


def dropped(page: str, reason: str) -> float:
    return metric(page, "gateway_trace_spans_dropped_total", reason=reason)


async def timed_requests(base_url: str) -> list[float]:
    """Each request's time to its whole answer, one after another."""
    times = []
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(REQUESTS):
            started = trio.current_time()
            response = await client.post(base_url + "/v1/chat/completions", json=chat())
            assert response.status_code == 200
            times.append(trio.current_time() - started)
    return times


async def test_a_collector_that_is_down_drops_spans_and_nothing_else() -> None:
    down = f"http://127.0.0.1:{free_port()}/v1/traces"
    async with running_sim(FAST_SIM) as sim:
        tracing = f'[tracing]\notlp_endpoint = "{down}"\nexport_timeout_s = 0.5\n{BOUNDS}'
        config = gateway_config(provider_toml("sim-a", sim.base_url), server=tracing)
        async with running_gateway(config) as gateway:
            await timed_requests(gateway.base_url)
            # Two spans per request, none exported: each is dropped, one way or the other.
            page = await scrape_when(
                gateway.base_url,
                lambda p: (
                    dropped(p, "queue_full")
                    + dropped(p, "export_failed")
                    + metric(p, "gateway_trace_spans_queued")
                    == 2 * REQUESTS
                ),
            )
    assert dropped(page, "export_failed") > 0
    assert metric(page, "gateway_trace_spans_exported_total") == 0


async def test_a_slow_collector_never_slows_a_request() -> None:
    # Each export takes 5 s (or the exporter's 1 s deadline); a request takes milliseconds.
    with running_receiver(delay_s=5.0) as receiver:
        async with running_sim(FAST_SIM) as sim:
            tracing = (
                f'[tracing]\notlp_endpoint = "{receiver.url}"\nexport_timeout_s = 1.0\n{BOUNDS}'
            )
            config = gateway_config(provider_toml("sim-a", sim.base_url), server=tracing)
            async with running_gateway(config) as gateway:
                started = trio.current_time()
                times = await timed_requests(gateway.base_url)
                elapsed = trio.current_time() - started
                # The queue's bound was met, and what did not fit was counted.
                await scrape_when(gateway.base_url, lambda p: dropped(p, "queue_full") > 0)
    # Had any request waited for an export, it alone would have taken a second or more.
    assert max(times) < 1.0, times
    assert elapsed < 5.0
    assert receiver.exports() >= 1  # the exporter did try, and was held


@pytest.mark.slow
def test_with_tracing_off_no_span_is_made_and_the_sdk_is_not_imported() -> None:
    """Off is free: a gateway without [tracing] serves a request and never loads
    OpenTelemetry (a process of its own: this one has loaded it for the tests above)."""
    code = textwrap.dedent(
        """
        import sys
        import httpx, trio
        from tests.e2e.harness import FAST_SIM, chat, gateway_config, provider_toml
        from tests.e2e.harness import running_gateway, running_sim
        from trio_gateway.ops import access

        spans = []
        record = access.RequestContext.record
        def spy(self, usage):
            spans.append(self.span)
            record(self, usage)
        access.RequestContext.record = spy

        async def main():
            async with running_sim(FAST_SIM) as sim:
                config = gateway_config(provider_toml("sim-a", sim.base_url))
                async with running_gateway(config) as gateway:
                    assert gateway.router.tracing is None
                    async with httpx.AsyncClient(timeout=30) as client:
                        url = gateway.base_url + "/v1/chat/completions"
                        assert (await client.post(url, json=chat())).status_code == 200

        trio.run(main)
        assert spans == [None], spans
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        assert not loaded, loaded
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.stdout.strip() == "ok", result.stderr


async def test_export_headers_come_from_the_environment_and_are_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    token = "Bearer otlp-s3cret-" + "x" * 8
    with running_receiver() as receiver:
        async with running_sim(FAST_SIM) as sim:
            text = (
                f'[server]\nlisten = "127.0.0.1:0"\n[tracing]\notlp_endpoint = "{receiver.url}"\n'
                'export_interval_s = 0.05\n[tracing.headers]\nauthorization = "OTLP_TOKEN"\n'
                f"[aliases.agent-lite]\n{provider_toml('sim-a', sim.base_url)}"
            )
            config = parse_config(
                text, source="test.toml", environ={"SIM_KEY": "sim-key", "OTLP_TOKEN": token}
            )
            async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
                response = await client.post(gateway.base_url + "/v1/chat/completions", json=chat())
                assert response.status_code == 200
                await wait_until(lambda: len(receiver.spans()) >= 2)
    assert receiver.requests[0]["authorization"] == token
    assert receiver.requests[0]["content-type"] == "application/x-protobuf"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "tracing: spans to " + receiver.url in logged
    assert "headers authorization" in logged
    assert "s3cret" not in logged
