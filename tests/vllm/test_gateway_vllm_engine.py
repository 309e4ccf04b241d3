"""The gateway in front of a real vLLM 0.32 (CPU, tiny random Qwen3), judged by vLLM's own
counters (/metrics, /load): a client that leaves makes vLLM abort, max_inflight keeps vLLM's
queue empty where vLLM alone queues, the readiness probe reads /load, a cancelled stream is
billed what vLLM generated, and cached prompt tokens reach the client.

Each test runs the gateway in-process on a free port with one provider, `vllm`, pointing at the
session's real server (tests/vllm/helpers.py), and talks to it with the official openai SDK or
raw httpx.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from tests.e2e.harness import provider_toml, running_gateway, wait_until
from tests.vllm.helpers import (
    ALIAS,
    KEY_ENV,
    PROVIDER,
    Json,
    chat,
    chunks_of,
    messages,
    metric,
    post,
    prom_value,
    vllm_gateway,
    wait_generation_settled,
    wait_load,
    wait_metric,
)
from tests.vllm.vllm_server import VllmServer
from trio_gateway.capacity.health import State
from trio_gateway.config.load import parse_config
from trio_gateway.process.serve import GatewayHandle

pytestmark = pytest.mark.vllm


def direct_body(vllm_server: VllmServer, max_tokens: int) -> Json:
    """A stream straight to vLLM, thinking off."""
    return {
        "model": vllm_server.served_model_name,
        "messages": messages(),
        "max_tokens": max_tokens,
        "stream": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }


@pytest.fixture
async def root(vllm_server: VllmServer) -> AsyncIterator[httpx.AsyncClient]:
    """vLLM itself, without a key: /metrics and /load."""
    async with httpx.AsyncClient(base_url=vllm_server.root_url, timeout=30.0) as client:
        yield client


# --- a client that leaves ----------------------------------------------------------------


async def test_a_client_that_leaves_makes_vllm_abort(
    gw: httpx.AsyncClient, root: httpx.AsyncClient, gateway: GatewayHandle
) -> None:
    before = await wait_generation_settled(root, within=30)
    max_tokens = 2000  # ~45 s of generation at the paced engine's ~43 tokens/s
    body = chat(max_tokens=max_tokens, ignore_eos=True, stream=True, reasoning=False)
    received = 0
    async with gw.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                received += 1
                if received == 20:
                    break
        assert await metric(root, "vllm:num_requests_running") == 1
    # The client left: the gateway closes its upstream response, and vLLM aborts.
    left_at = trio.current_time()
    await wait_metric(root, "vllm:num_requests_running", 0, within=10)
    abort_s = trio.current_time() - left_at
    settled = await metric(root, "vllm:generation_tokens_total")
    await trio.sleep(1.0)  # sampling a counter over time: there is nothing to wait on
    assert await metric(root, "vllm:generation_tokens_total") == settled, "still generating"
    generated = settled - before
    assert 19 <= generated < 200, generated  # ~20 read, a few in flight; not 2000
    await wait_load(root, 0, within=10)
    upstream = gateway.router.upstreams[PROVIDER]
    assert upstream.statistics().in_flight == 0, "the gateway's slot is free again"
    cancelled = gateway.router.metrics.registry.get_sample_value(
        "gateway_cancellations_total", {"cause": "client_gone"}
    )
    assert cancelled == 1
    assert abort_s < 5, abort_s


# --- admission: max_inflight -------------------------------------------------------------


@attrs.define
class Peaks:
    vllm_running: float = 0
    vllm_waiting: float = 0
    gateway_in_flight: int = 0
    gateway_waiting: int = 0
    samples: int = 0


async def concurrent_streams(
    client: httpx.AsyncClient,
    root: httpx.AsyncClient,
    n: int,
    body: Json,
    path: str,
    gateway: GatewayHandle | None = None,
) -> tuple[list[int], list[str], Peaks]:
    """Run `n` streams at once and sample vLLM's (and the gateway's) queues until all end."""
    statuses: list[int] = []
    finishes: list[str] = []
    peaks = Peaks()

    async def one_stream() -> None:
        async with client.stream("POST", path, json=body) as resp:
            statuses.append(resp.status_code)
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line.removeprefix("data: "))
                    finishes.extend(
                        ch["finish_reason"] for ch in chunk["choices"] if ch.get("finish_reason")
                    )

    async def sample(done: trio.Event) -> None:
        while not done.is_set():
            running = await metric(root, "vllm:num_requests_running")
            waiting = await metric(root, "vllm:num_requests_waiting")
            peaks.vllm_running = max(peaks.vllm_running, running)
            peaks.vllm_waiting = max(peaks.vllm_waiting, waiting)
            if gateway is not None:
                gate = gateway.router.upstreams[PROVIDER].statistics()
                peaks.gateway_in_flight = max(peaks.gateway_in_flight, gate.in_flight)
                peaks.gateway_waiting = max(peaks.gateway_waiting, gate.waiting)
            peaks.samples += 1
            await trio.sleep(0.05)

    done = trio.Event()
    with trio.fail_after(60):
        async with trio.open_nursery() as watcher:
            watcher.start_soon(sample, done)
            async with trio.open_nursery() as streams:
                for _ in range(n):
                    streams.start_soon(one_stream)
            done.set()
    return statuses, finishes, peaks


async def test_the_gateway_never_sends_vllm_more_than_max_inflight(
    vllm_server: VllmServer, root: httpx.AsyncClient
) -> None:
    """vLLM runs 4 at once and queues the rest without a word; the gateway holds back all but
    max_inflight = 2, so vLLM's own queue stays empty."""
    await wait_metric(root, "vllm:num_requests_running", 0, within=30)
    n = 6
    body = chat(max_tokens=30, stream=True, reasoning=False)
    async with (
        vllm_gateway(vllm_server, max_inflight=2, extra="queue_timeout_s = 60") as gateway,
        httpx.AsyncClient(base_url=gateway.base_url, timeout=120) as gw,
    ):
        statuses, finishes, peaks = await concurrent_streams(
            gw, root, n, body, "/v1/chat/completions", gateway
        )
    assert statuses == [200] * n
    assert finishes == ["length"] * n
    assert peaks.samples >= 10, peaks
    assert peaks.vllm_running == 2, peaks
    assert peaks.vllm_waiting == 0, peaks
    assert peaks.gateway_in_flight == 2, peaks
    assert peaks.gateway_waiting >= 3, peaks  # the gateway held the rest


async def test_without_the_gateway_vllm_queues_beyond_max_num_seqs(
    vllm_server: VllmServer, root: httpx.AsyncClient
) -> None:
    """The contrast: the same 6 streams sent straight to vLLM (--max-num-seqs 4)."""
    await wait_metric(root, "vllm:num_requests_running", 0, within=30)
    body = direct_body(vllm_server, max_tokens=30)
    async with httpx.AsyncClient(
        base_url=vllm_server.base_url, headers=vllm_server.auth_headers, timeout=120
    ) as direct:
        statuses, finishes, peaks = await concurrent_streams(
            direct, root, 6, body, "/chat/completions"
        )
    assert statuses == [200] * 6 and finishes == ["length"] * 6
    assert peaks.vllm_running == 4, peaks
    assert peaks.vllm_waiting >= 1, peaks


# --- readiness and /load -----------------------------------------------------------------

PROBES = "probe_interval_s = 0.2\nprobe_timeout_s = 10.0\nhealthy_after = 1"


async def test_readiness_probe_passes_and_load_is_read(
    vllm_server: VllmServer, root: httpx.AsyncClient
) -> None:
    async with (
        vllm_gateway(vllm_server, probe=True, extra=PROBES) as gateway,
        httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as gw,
    ):
        health = gateway.router.health[PROVIDER]

        def load() -> int | None:
            return health.snapshot(trio.current_time()).upstream_load

        # The probe is a real one-token generation at vLLM.
        await wait_until(lambda: health.state is State.HEALTHY, timeout_s=30)
        ready = await gw.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        entry = ready.json()["providers"][PROVIDER]
        assert entry["state"] == "healthy" and entry["last_error"] is None
        await wait_until(lambda: load() == 0, timeout_s=10)

        # Two long streams straight to vLLM (not through the gateway): its /load counts them,
        # and the next probe reads that.
        body = direct_body(vllm_server, max_tokens=2000)
        async with (
            httpx.AsyncClient(
                base_url=vllm_server.base_url, headers=vllm_server.auth_headers, timeout=60
            ) as direct,
            trio.open_nursery() as nursery,
        ):

            async def hold_stream() -> None:
                async with direct.stream("POST", "/chat/completions", json=body) as resp:
                    async for _ in resp.aiter_bytes():
                        pass

            for _ in range(2):
                nursery.start_soon(hold_stream)
            await wait_until(lambda: (load() or 0) >= 2, timeout_s=10)
            ready = await gw.get("/readyz")
            assert ready.json()["providers"][PROVIDER]["upstream_load"] >= 2
            page = (await gw.get("/metrics")).text
            gauge = prom_value(page, "gateway_provider_upstream_load", provider=PROVIDER)
            assert gauge is not None and gauge >= 2
            nursery.cancel_scope.cancel()  # the two clients leave; vLLM aborts them
        await wait_until(lambda: load() == 0, timeout_s=10)
        assert health.state is State.HEALTHY
    await wait_load(root, 0, within=10)


# --- usage records ---------------------------------------------------------------------------


async def test_a_cancelled_stream_is_billed_what_vllm_generated(
    vllm_server: VllmServer, root: httpx.AsyncClient, tmp_path: Path
) -> None:
    """continuous_usage_stats: the record of a stream the client left is vLLM's own count up to
    the last chunk the gateway read; vLLM may generate a token or two more before it sees the
    disconnect, never fewer."""
    ledger = tmp_path / "usage.sqlite3"
    provider = provider_toml(
        PROVIDER, vllm_server.root_url, alias=ALIAS, max_inflight=4, api_key_env=KEY_ENV
    )
    text = (
        f'[server]\nlisten = "127.0.0.1:0"\n[usage]\nledger = "{ledger}"\n'
        f"[aliases.{ALIAS}]\n{provider}"
    )
    config = parse_config(text, source="vllm-usage.toml", environ={KEY_ENV: vllm_server.api_key})
    before = await wait_generation_settled(root, within=30)
    body = chat(max_tokens=2000, ignore_eos=True, stream=True, reasoning=False)
    content_chunks = 0
    async with running_gateway(config) as gateway:
        async with (
            httpx.AsyncClient(base_url=gateway.base_url, timeout=120.0) as gw,
            gw.stream("POST", "/v1/chat/completions", json=body) as resp,
        ):
            assert resp.status_code == 200
            request_id = resp.headers["x-request-id"]
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    assert "usage" not in chunk  # not asked for: never shown
                    if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        content_chunks += 1
                if content_chunks == 20:
                    break
        await wait_metric(root, "vllm:num_requests_running", 0, within=10)
    generated = await metric(root, "vllm:generation_tokens_total") - before
    conn = sqlite3.connect(ledger)
    try:
        rows = conn.execute(
            "SELECT request_id, outcome, completion_tokens, prompt_tokens, estimated FROM usage"
        ).fetchall()
    finally:
        conn.close()
    assert len(rows) == 1
    rid, outcome, completion, prompt, estimated = rows[0]
    assert (rid, outcome, estimated) == (request_id, "cancelled", 0)
    assert prompt > 0
    assert content_chunks <= completion <= generated, (content_chunks, completion, generated)
    assert generated - completion <= 5, (completion, generated)


async def test_cached_prompt_tokens_reach_the_client(
    gw: httpx.AsyncClient, root: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    """vLLM 0.32 with --enable-prompt-tokens-details (tools/vllm/serve.py) reports the prompt
    tokens its prefix cache served, in the stream's usage chunk and a whole answer's usage; the
    gateway passes the count on. The prompt is new to this server (a random word first), so the
    first request finds nothing and the second finds the prefix."""
    prompt = secrets.token_hex(4) + " " + "the quick brown fox jumps over the lazy dog " * 30
    seen = []
    for stream in (False, True):
        body = chat(prompt, max_tokens=2, reasoning=False, stream=stream)
        if stream:
            body["stream_options"] = {"include_usage": True}
        transcript = await post(gw, body)
        assert transcript.status == 200, transcript
        usage = chunks_of(transcript)[-1]["usage"] if stream else transcript.body["usage"]
        seen.append(usage)
    first, second = seen
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["prompt_tokens"], second
    # What vLLM itself says, straight: the same field in the stream's usage chunk.
    direct = {
        "model": vllm_server.served_model_name,
        "messages": messages(prompt),
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    headers = {"Authorization": f"Bearer {vllm_server.api_key}"}
    response = await root.post("/v1/chat/completions", json=direct, headers=headers)
    usage_line = [line for line in response.text.splitlines() if '"usage"' in line][-1]
    raw = json.loads(usage_line.removeprefix("data: "))["usage"]
    # vLLM 0.32 also says how many prompt tokens it wrote into the cache; the gateway's usage
    # carries OpenAI's one field.
    assert raw["prompt_tokens_details"] == {"cached_tokens": cached, "created_cache_tokens": 0}
