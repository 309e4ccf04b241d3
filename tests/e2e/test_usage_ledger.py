"""Usage records end to end: the real simulator, the gateway, its SQLite ledger, the CLI."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.e2e.harness import (
    FAST_SIM,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from trio_gateway.config.schema import GatewayConfig

CLI = [sys.executable, "-m", "trio_gateway"]
K = 5
# K tokens, then a pause the client never waits out: the upstream has generated exactly K.
PAUSE_AFTER_K = script({"text_tokens": K}, {"delay_s": 60}, {"text_tokens": 50})


def config_with_ledger(base_url: str, ledger: Path) -> GatewayConfig:
    usage = f'[usage]\nledger = "{ledger}"\nflush_interval_s = 0.05\nbatch_max = 16\n'
    # Room for every request of the burst at once: a queue timeout on a loaded machine would
    # turn an expected 200 into a 503.
    provider = provider_toml(
        "sim-a", base_url, max_inflight=64, extra="unhealthy_after = 1000\nqueue_timeout_s = 30.0"
    )
    return gateway_config(provider, server=usage)


async def cli(args: list[str]) -> str:
    with trio.fail_after(60):
        result = await trio.run_process([*CLI, *args], capture_stdout=True, capture_stderr=True)
    return result.stdout.decode()


def ledger_rows(path: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM usage ORDER BY id")]
    finally:
        conn.close()


async def read_k_content_chunks(client: httpx.AsyncClient, url: str, body: Any) -> tuple[str, int]:
    """Stream, read ``K`` content chunks, leave. The request id and the chunks seen."""
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        seen = 0
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert "usage" not in chunk  # the client did not ask for usage
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    seen += 1
            if seen == K:
                break
    return request_id, seen


async def test_a_cancelled_stream_is_billed_exactly_what_was_streamed(tmp_path: Path) -> None:
    ledger = tmp_path / "usage.sqlite3"
    async with running_sim() as sim:
        async with running_gateway(config_with_ledger(sim.base_url, ledger)) as gateway:
            async with httpx.AsyncClient() as client:
                request_id, seen = await read_k_content_chunks(
                    client,
                    gateway.base_url + "/v1/chat/completions",
                    chat(PAUSE_AFTER_K, stream=True),
                )
            with trio.fail_after(10):
                stats = await sim.engine.wait_until(lambda s: s.aborts == 1 and not s.running)
            async with httpx.AsyncClient() as client:
                scrape = (await client.get(gateway.base_url + "/metrics")).text
            assert 'gateway_usage_dropped_total{reason="queue_full"} 0.0' in scrape
        # The gateway has stopped: its ledger wrote everything out.
        rows = ledger_rows(ledger)
    assert seen == K
    assert len(rows) == 1
    row = rows[0]
    assert row["request_id"] == request_id
    assert row["outcome"] == "cancelled" and row["error_code"] == "client_gone"
    assert row["provider"] == "sim-a" and row["alias"] == "agent-lite"
    # Exactly what vLLM generated (and so bills) up to the last chunk relayed, from the
    # continuous usage on that chunk: not estimated.
    assert stats.tokens_generated == K
    assert row["completion_tokens"] == K
    assert row["prompt_tokens"] == stats.prompt_tokens > 0
    assert row["estimated"] == 0
    assert row["ttft_s"] is not None and row["duration_s"] >= row["ttft_s"]
    # The upstream was asked for cumulative usage on every chunk.
    body = stats.last_request_body
    assert body is not None
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


async def test_a_burst_of_mixed_requests_leaves_one_record_each(tmp_path: Path) -> None:
    """50 requests: completed (streamed, with and without usage, and whole), cancelled, failed
    upstream (before and after the first token), refused (unknown model, invalid JSON)."""
    ledger = tmp_path / "usage.sqlite3"
    sim_config = FAST_SIM
    expected: Counter[str] = Counter()
    request_ids: list[str] = []
    seen_usage: dict[str, int] = {}  # request id → completion tokens the client was told
    async with running_sim(sim_config) as sim:
        config = config_with_ledger(sim.base_url, ledger)
        async with running_gateway(config) as gateway:
            url = gateway.base_url + "/v1/chat/completions"

            async def completed_stream(client: httpx.AsyncClient, include_usage: bool) -> None:
                fields: dict[str, Any] = {"stream": True}
                if include_usage:
                    fields["stream_options"] = {"include_usage": True}
                response = await client.post(url, json=chat(script({"text_tokens": 8}), **fields))
                assert response.status_code == 200
                request_ids.append(response.headers["x-request-id"])
                chunks = [
                    json.loads(line[6:])
                    for line in response.text.split("\n")
                    if line.startswith("data: {")
                ]
                with_usage = [c for c in chunks if c.get("usage")]
                if include_usage:
                    assert len(with_usage) == 1 and with_usage[0]["choices"] == []
                    seen_usage[request_ids[-1]] = with_usage[0]["usage"]["completion_tokens"]
                else:
                    assert not with_usage and all("usage" not in c for c in chunks)

            async def whole(client: httpx.AsyncClient) -> None:
                response = await client.post(url, json=chat(script({"text_tokens": 6})))
                assert response.status_code == 200
                request_ids.append(response.headers["x-request-id"])
                seen_usage[request_ids[-1]] = response.json()["usage"]["completion_tokens"]

            async def cancelled(client: httpx.AsyncClient) -> None:
                request_id, _ = await read_k_content_chunks(
                    client, url, chat(PAUSE_AFTER_K, stream=True)
                )
                request_ids.append(request_id)

            async def failed_at_once(client: httpx.AsyncClient) -> None:
                response = await client.post(url, json=chat(script({"status": 500}), stream=True))
                assert response.status_code == 502
                request_ids.append(response.headers["x-request-id"])

            async def failed_mid_stream(client: httpx.AsyncClient) -> None:
                body = chat(script({"text_tokens": 3}, {"status": 500, "in_stream": True}))
                response = await client.post(url, json={**body, "stream": True})
                assert response.status_code == 200 and '"error"' in response.text
                request_ids.append(response.headers["x-request-id"])

            async def unknown_model(client: httpx.AsyncClient) -> None:
                response = await client.post(url, json={**chat(), "model": "nope"})
                assert response.status_code == 404
                request_ids.append(response.headers["x-request-id"])

            async def invalid_json(client: httpx.AsyncClient) -> None:
                response = await client.post(url, content=b"{not json")
                assert response.status_code == 400
                request_ids.append(response.headers["x-request-id"])

            plan = (
                [("completed", lambda c: completed_stream(c, False))] * 10
                + [("completed", lambda c: completed_stream(c, True))] * 8
                + [("completed", whole)] * 8
                + [("cancelled", cancelled)] * 8
                + [("failed", failed_at_once)] * 4
                + [("failed", failed_mid_stream)] * 4
                + [("refused", unknown_model)] * 4
                + [("refused", invalid_json)] * 4
            )
            assert len(plan) == 50
            limits = httpx.Limits(max_connections=60)
            async with (
                httpx.AsyncClient(limits=limits, timeout=30) as client,
                trio.open_nursery() as nursery,
            ):
                for outcome, run in plan:
                    expected[outcome] += 1
                    nursery.start_soon(run, client)
            await wait_until(lambda: sim.engine.stats().running == 0, timeout_s=10)
        rows = ledger_rows(ledger)
    assert len(rows) == 50
    assert sorted(r["request_id"] for r in rows) == sorted(request_ids)
    assert Counter(r["outcome"] for r in rows) == expected
    by_outcome: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_outcome.setdefault(r["outcome"], []).append(r)
    assert all(r["completion_tokens"] == K for r in by_outcome["cancelled"])
    assert all(r["estimated"] == 0 for r in rows)
    completed = by_outcome["completed"]
    # 8 and 6 text tokens, each plus the end-of-sequence token.
    assert sorted(r["completion_tokens"] for r in completed) == sorted([9] * 18 + [7] * 8)
    # What clients were told (those that asked) is what was recorded.
    assert len(seen_usage) == 16
    assert all(
        seen_usage[r["request_id"]] == r["completion_tokens"]
        for r in completed
        if r["request_id"] in seen_usage
    )
    failed = sorted(r["completion_tokens"] for r in by_outcome["failed"])
    assert failed == [0] * 4 + [3] * 4  # an upstream error mid-stream bills what streamed
    assert {r["error_code"] for r in by_outcome["refused"]} == {"model_not_found", "invalid_json"}
    assert all(r["prompt_tokens"] == 0 and r["provider"] is None for r in by_outcome["refused"])

    # The CLI reads the same file.
    table = await cli(
        ["usage", "--ledger", str(ledger), "--by", "provider"],
    )
    lines = table.splitlines()
    assert lines[0].split()[:6] == [
        "provider",
        "requests",
        "completed",
        "cancelled",
        "failed",
        "refused",
    ]
    total = lines[-1].split()
    assert total[:6] == ["total", "50", "26", "8", "8", "8"]
    assert int(total[7]) == sum(r["completion_tokens"] for r in rows)
    out = await cli(
        ["usage", "--ledger", str(ledger), "--json", "--since", "1h"],
    )
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 50
    for key in (
        "request_id", "key", "alias", "provider", "outcome", "prompt_tokens",
        "completion_tokens", "reasoning_tokens", "cached_tokens", "estimated",
    ):  # fmt: skip
        assert all(key in record for record in records)
    assert {r["request_id"] for r in records} == set(request_ids)
    future = await cli(
        ["usage", "--ledger", str(ledger), "--json", "--since", "2999-01-01"],
    )
    assert future == ""
