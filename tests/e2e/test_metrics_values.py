"""/metrics values below the real-vLLM tier: token counters against the usage the client got,
the time-to-first-token histogram against the requests that produced a first token."""

from __future__ import annotations

import os

import httpx
import trio

from tests.e2e.harness import Stack, chat, script
from tests.e2e.test_admission import metric, requests_total, scrape_when

LABELS = {"alias": "agent-lite", "provider": "sim-a"}


async def test_token_counters_add_up_the_usage_each_client_was_told(stack: Stack) -> None:
    answers = [
        script({"reasoning_tokens": 3}, {"text_tokens": 5}),
        script({"reasoning_tokens": 2}, {"text_tokens": 4}),
    ]
    usages = []
    async with httpx.AsyncClient(timeout=30) as client:
        for answer in answers:
            response = await client.post(stack.v1 + "/chat/completions", json=chat(answer))
            assert response.status_code == 200
            usages.append(response.json()["usage"])
        failed = await client.post(
            stack.v1 + "/chat/completions", json=chat(script({"status": 418}))
        )
        assert failed.status_code == 400
    page = await scrape_when(stack.gateway.base_url, lambda p: requests_total(p) == 3)

    def tokens(kind: str) -> float:
        return metric(page, "gateway_tokens_total", kind=kind, **LABELS)

    assert tokens("prompt") == sum(u["prompt_tokens"] for u in usages) > 0
    assert tokens("completion") == sum(u["completion_tokens"] for u in usages) > 0
    reasoning = sum(u["completion_tokens_details"]["reasoning_tokens"] for u in usages)
    assert tokens("reasoning") == reasoning > 0

    # Two answers had a first token; the refused one did not, yet it took time.
    ttft = "gateway_time_to_first_token_seconds"
    assert metric(page, ttft + "_count", **LABELS) == 2
    assert metric(page, ttft + "_bucket", le="+Inf", **LABELS) == 2
    duration = "gateway_request_duration_seconds"
    assert metric(page, duration + "_count", **LABELS) == 3
    assert 0 < metric(page, ttft + "_sum", **LABELS) < metric(page, duration + "_sum", **LABELS)


async def test_process_metrics_describe_this_process(stack: Stack) -> None:
    """Per process (a worker of [server] workers reports its own): memory and descriptors."""
    async with httpx.AsyncClient() as client:
        page = (await client.get(stack.gateway.base_url + "/metrics")).text
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in page.splitlines()
        if line.startswith("process_")
    }
    statm = await trio.Path("/proc/self/statm").read_text()
    resident = int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE")
    # The gateway runs in this test's process: the same resident set, within what the
    # scrape itself allocates.
    assert abs(values["process_resident_memory_bytes"] - resident) < 64 * 1024 * 1024
    assert values["process_open_fds"] >= 3
    assert values["process_cpu_seconds_total"] > 0
