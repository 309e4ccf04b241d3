"""Direct tests against a real vLLM 0.32 (CPU) serving the tiny random Qwen3: the dialect the
gateway talks to, proven on the real thing (compare shared/fixtures/vllm-0.32.0/).

The model's words are noise. Two properties of the tiny model make the tests deterministic:
it never ends a turn by itself (unconstrained generations run to max_tokens), and when a
`structured_outputs.regex` spells out <think>/</think>/<tool_call>, it writes the added
tokens, so vLLM's qwen3 reasoning parser and hermes tool parser work as with real Qwen3.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from tests.vllm.helpers import TOOL_CALL_RE, WEATHER_TOOL, metric, wait_load, wait_metric
from tests.vllm.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

Json = dict[str, Any]

# Regexes are matched against the generated text; the model writes the tags as added tokens.
THINK_THEN_TOOL_RE = r"<think>abc</think>\n\n" + TOOL_CALL_RE
NO_THINK: Json = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture
async def client(vllm_server: VllmServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=vllm_server.base_url, headers=vllm_server.auth_headers, timeout=120.0
    ) as c:
        yield c


@pytest.fixture
async def root(vllm_server: VllmServer) -> AsyncIterator[httpx.AsyncClient]:
    """No API key: /health, /metrics and /load are open."""
    async with httpx.AsyncClient(base_url=vllm_server.root_url, timeout=30.0) as c:
        yield c


def chat(vllm_server: VllmServer, content: str = "what is the weather in paris", **kw: Any) -> Json:
    return {
        "model": vllm_server.served_model_name,
        "messages": [{"role": "user", "content": content}],
        **kw,
    }


async def stream_chunks(client: httpx.AsyncClient, body: Json) -> tuple[list[Json], bool]:
    """POST a streaming request; return the parsed `data:` chunks and whether [DONE] came."""
    chunks: list[Json] = []
    async with client.stream("POST", "/chat/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                assert line == "", line  # only data lines and blank separators
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                return chunks, True
            chunks.append(json.loads(data))
    return chunks, False


def deltas(chunks: list[Json], key: str) -> str:
    return "".join(
        c["choices"][0]["delta"].get(key) or ""
        for c in chunks
        if c["choices"] and "delta" in c["choices"][0]
    )


def finish_reasons(chunks: list[Json]) -> list[str]:
    return [
        ch["finish_reason"]
        for c in chunks
        for ch in c["choices"]
        if ch.get("finish_reason") is not None
    ]


# --- streaming and usage ------------------------------------------------------------------


async def test_stream_include_usage_sends_one_usage_chunk(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    body = chat(
        vllm_server, max_tokens=8, stream=True, stream_options={"include_usage": True}, **NO_THINK
    )
    chunks, done = await stream_chunks(client, body)
    assert done
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    usage_chunks = [c for c in chunks if c.get("usage")]
    assert usage_chunks == [chunks[-1]], "exactly one usage chunk, the last before [DONE]"
    last = chunks[-1]
    assert last["choices"] == []
    usage = last["usage"]
    assert usage["completion_tokens"] == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 0}
    # The model never stops by itself: max_tokens ends it.
    assert finish_reasons(chunks) == ["length"]
    assert all(c["model"] == "qwen3-32b" and c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1


async def test_stream_without_include_usage_has_no_usage(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    extras: list[Json] = [{}, {"stream_options": {"include_usage": False}}]
    for extra in extras:
        chunks, done = await stream_chunks(
            client, chat(vllm_server, max_tokens=8, stream=True, **NO_THINK, **extra)
        )
        assert done
        assert not any("usage" in c for c in chunks), "no token counts at all"
        assert all(c["choices"] for c in chunks)
        assert finish_reasons(chunks) == ["length"]


async def test_continuous_usage_stats_puts_usage_on_every_chunk(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    opts = {"include_usage": True, "continuous_usage_stats": True}
    chunks, _ = await stream_chunks(
        client, chat(vllm_server, max_tokens=5, stream=True, stream_options=opts, **NO_THINK)
    )
    assert all("usage" in c for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


async def test_streamed_reasoning_tokens_count_deltas_not_tokens(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    """Surprise: in a stream, `completion_tokens_details.reasoning_tokens` is the number of
    reasoning *deltas*. When vLLM merges tokens into one delta (a multi-byte character split
    over tokens; an API server behind the engine), it counts fewer than were generated; the
    non-streamed answer counts tokens. The gateway always streams upstream, so it gets the
    streamed count."""
    body = chat(vllm_server, "hi", max_tokens=12, temperature=0)
    whole = (await client.post("/chat/completions", json=body)).json()
    assert whole["usage"]["completion_tokens_details"]["reasoning_tokens"] == 12
    chunks, _ = await stream_chunks(
        client, {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    n_deltas = sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning"))
    streamed = chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert streamed == n_deltas
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    # Same text both ways (temperature 0); with this prompt some deltas hold several tokens.
    assert deltas(chunks, "reasoning") == whole["choices"][0]["message"]["reasoning"]
    assert n_deltas < 12


# --- reasoning ------------------------------------------------------------------------------


async def test_thinking_default_puts_everything_in_reasoning(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    resp = await client.post("/chat/completions", json=chat(vllm_server, max_tokens=12))
    assert resp.status_code == 200
    body = resp.json()
    msg = body["choices"][0]["message"]
    assert "reasoning_content" not in msg, "vLLM 0.32 names the field `reasoning`"
    assert msg["content"] is None and isinstance(msg["reasoning"], str) and msg["reasoning"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 12
    assert body["choices"][0]["finish_reason"] == "length"


async def test_reasoning_stream_with_regex(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    body = chat(
        vllm_server,
        max_tokens=60,
        temperature=0,
        stream=True,
        structured_outputs={"regex": "<think>abc</think>hello"},
    )
    chunks, done = await stream_chunks(client, body)
    assert done
    assert deltas(chunks, "reasoning") == "abc"
    assert deltas(chunks, "content") == "hello"
    assert not any("reasoning_content" in c["choices"][0]["delta"] for c in chunks if c["choices"])
    assert finish_reasons(chunks) == ["stop"]
    # Reasoning deltas all come before content deltas.
    kinds = [k for c in chunks for k in ("reasoning", "content") if c["choices"][0]["delta"].get(k)]
    assert kinds == sorted(kinds, key=lambda k: k == "content")


async def test_reasoning_nonstream_with_regex(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    body = chat(
        vllm_server,
        max_tokens=60,
        temperature=0,
        structured_outputs={"regex": "<think>abc</think>hello"},
    )
    resp = await client.post("/chat/completions", json=body)
    assert resp.status_code == 200
    choice = resp.json()["choices"][0]
    assert choice["message"]["reasoning"] == "abc"
    assert choice["message"]["content"] == "hello"
    assert choice["finish_reason"] == "stop"


async def test_thinking_off_via_chat_template_kwargs(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    resp = await client.post("/chat/completions", json=chat(vllm_server, max_tokens=10, **NO_THINK))
    assert resp.status_code == 200
    body = resp.json()
    msg = body["choices"][0]["message"]
    assert msg["reasoning"] is None
    assert isinstance(msg["content"], str)
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    # With thinking off, a forced answer lands in content, streamed or not.
    forced = chat(
        vllm_server, max_tokens=20, temperature=0, structured_outputs={"regex": "hello"}, **NO_THINK
    )
    chunks, _ = await stream_chunks(client, {**forced, "stream": True})
    assert deltas(chunks, "content") == "hello"
    assert deltas(chunks, "reasoning") == ""
    assert finish_reasons(chunks) == ["stop"]


# --- tool calls (hermes) -------------------------------------------------------------------


async def test_tool_call_stream_fragments(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    body = chat(
        vllm_server,
        max_tokens=60,
        temperature=0,
        stream=True,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        structured_outputs={"regex": TOOL_CALL_RE},
        **NO_THINK,
    )
    chunks, done = await stream_chunks(client, body)
    assert done
    frags = [
        tc
        for c in chunks
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls") or []
    ]
    assert len(frags) >= 2
    first, rest = frags[0], frags[1:]
    assert first["index"] == 0 and first["type"] == "function"
    assert first["id"].startswith("chatcmpl-tool-")
    assert first["function"] == {"name": "get_weather"}  # no arguments in the first fragment
    for frag in rest:
        assert set(frag) == {"index", "function"} and frag["index"] == 0
        assert set(frag["function"]) == {"arguments"}
    arguments = "".join(f["function"]["arguments"] for f in rest)
    assert json.loads(arguments) == {"city": "x"}  # valid JSON only once the stream ended
    assert finish_reasons(chunks) == ["tool_calls"]
    assert deltas(chunks, "content") == ""


async def test_tool_call_nonstream(client: httpx.AsyncClient, vllm_server: VllmServer) -> None:
    body = chat(
        vllm_server,
        max_tokens=60,
        temperature=0,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        structured_outputs={"regex": TOOL_CALL_RE},
        **NO_THINK,
    )
    resp = await client.post("/chat/completions", json=body)
    assert resp.status_code == 200
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "x"}


async def test_reasoning_then_tool_call_stream(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    body = chat(
        vllm_server,
        max_tokens=80,
        temperature=0,
        stream=True,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        structured_outputs={"regex": THINK_THEN_TOOL_RE},
    )
    chunks, _ = await stream_chunks(client, body)
    assert deltas(chunks, "reasoning") == "abc"
    # The "\n\n" between </think> and <tool_call> is streamed as content (non-streamed: null).
    assert deltas(chunks, "content").strip() == ""
    frags = [
        tc
        for c in chunks
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls") or []
    ]
    assert frags[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(f["function"].get("arguments", "") for f in frags)) == {"city": "x"}
    assert finish_reasons(chunks) == ["tool_calls"]


# --- errors ---------------------------------------------------------------------------------


async def test_context_length_400_input_tokens(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    long_prompt = "hello world weather " * 300  # 8 tokens each
    for stream in (False, True):
        body = chat(vllm_server, long_prompt, max_tokens=10, stream=stream)
        resp = await client.post("/chat/completions", json=body)
        assert resp.status_code == 400  # a plain JSON error, even when streaming was asked
        assert resp.headers["content-type"].startswith("application/json")
        err = resp.json()["error"]
        assert err["param"] == "input_tokens"
        assert err["type"] == "BadRequestError" and err["code"] == 400
        assert "maximum context length is 2048 tokens" in err["message"]
        assert "context_length_exceeded" not in resp.text


async def test_max_tokens_over_limit_400_but_sum_is_clamped(
    client: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    resp = await client.post("/chat/completions", json=chat(vllm_server, max_tokens=3000))
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "max_tokens"
    # prompt + max_tokens over max_model_len is not rejected: the output is cut at the limit.
    body = chat(vllm_server, "hello world weather " * 250, max_tokens=200, **NO_THINK)
    resp = await client.post("/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] > 2048 - 200
    assert out["usage"]["total_tokens"] == 2048


async def test_auth_401_and_open_endpoints(
    vllm_server: VllmServer, root: httpx.AsyncClient
) -> None:
    body = chat(vllm_server, max_tokens=1)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = await root.post("/v1/chat/completions", json=body, headers=headers)
        assert resp.status_code == 401
        assert resp.json() == {"error": "Unauthorized"}  # not the OpenAI error shape
    assert (await root.get("/v1/models")).status_code == 401
    for path in ("/health", "/metrics", "/load"):
        assert (await root.get(path)).status_code == 200, path


async def test_models_and_unknown_model(client: httpx.AsyncClient, vllm_server: VllmServer) -> None:
    models = (await client.get("/models")).json()
    assert [m["id"] for m in models["data"]] == ["qwen3-32b"]
    assert models["data"][0]["max_model_len"] == 2048
    resp = await client.post("/chat/completions", json={**chat(vllm_server), "model": "other"})
    assert resp.status_code == 404
    err = resp.json()["error"]
    assert err["type"] == "NotFoundError" and err["param"] == "model"


async def test_ignored_fields_accepted(client: httpx.AsyncClient, vllm_server: VllmServer) -> None:
    body = chat(vllm_server, max_tokens=2, user="u-1", store=True, metadata={"k": "v"}, **NO_THINK)
    resp = await client.post("/chat/completions", json=body)
    assert resp.status_code == 200


# --- load signals and disconnects ---------------------------------------------------------


async def test_load_counts_inflight_requests(
    client: httpx.AsyncClient, root: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    await wait_metric(root, "vllm:num_requests_running", 0, within=30)
    assert (await root.get("/load")).json() == {"server_load": 0}
    assert await metric(root, "vllm:num_requests_waiting") == 0
    body = chat(vllm_server, max_tokens=2000, stream=True, **NO_THINK)
    async with client.stream("POST", "/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                break
        # /load counts HTTP requests in flight (until the last byte is written), not sequences.
        assert (await root.get("/load")).json()["server_load"] >= 1
    await wait_load(root, 0, within=30)
    await wait_metric(root, "vllm:num_requests_running", 0, within=30)


def test_metrics_names(vllm_server: VllmServer) -> None:
    text = httpx.get(f"{vllm_server.root_url}/metrics", timeout=30).text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:request_success_total",
        "vllm:kv_cache_usage_perc",
    ):
        assert re.search(rf'^{name}{{[^}}]*model_name="qwen3-32b"[^}}]*}} ', text, re.M), name


async def test_disconnect_aborts_generation(
    client: httpx.AsyncClient, root: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    await wait_metric(root, "vllm:num_requests_running", 0, within=30)
    before = await metric(root, "vllm:generation_tokens_total")
    finished_before = await metric(root, "vllm:request_success_total")
    max_tokens = 2000  # ~2-3 s of generation for the tiny model on 2 cores
    body = chat(vllm_server, max_tokens=max_tokens, ignore_eos=True, stream=True, **NO_THINK)
    received = 0
    async with client.stream("POST", "/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                received += 1
                if received == 20:
                    break
    # Leaving the block closed the connection mid-stream: vLLM must abort the request.
    await wait_metric(root, "vllm:num_requests_running", 0, within=15)
    settled = await metric(root, "vllm:generation_tokens_total")
    await trio.sleep(1.5)
    assert await metric(root, "vllm:generation_tokens_total") == settled, "still generating"
    generated = settled - before
    assert 19 <= generated < max_tokens, generated
    # Surprise: a request aborted by a disconnect is not counted in request_success_total at
    # all (not even as finished_reason="abort"), so "finished" counters undercount.
    assert await metric(root, "vllm:request_success_total") == finished_before
    await wait_load(root, 0, within=15)


async def test_queueing_beyond_max_num_seqs(
    client: httpx.AsyncClient, root: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    """--max-num-seqs 4: the rest wait in vLLM's queue; no status code says "full"."""
    await wait_metric(root, "vllm:num_requests_running", 0, within=30)
    n_streams = 8
    statuses: list[int] = []
    finishes: list[str] = []
    peak = {"running": 0.0, "waiting": 0.0, "load": 0.0}

    async def one_stream() -> None:
        body = chat(vllm_server, max_tokens=40, stream=True, **NO_THINK)
        async with client.stream("POST", "/chat/completions", json=body) as resp:
            statuses.append(resp.status_code)
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    finishes.extend(finish_reasons([json.loads(line.removeprefix("data: "))]))

    async def watch(done: trio.Event) -> None:
        while not done.is_set():
            peak["running"] = max(peak["running"], await metric(root, "vllm:num_requests_running"))
            peak["waiting"] = max(peak["waiting"], await metric(root, "vllm:num_requests_waiting"))
            peak["load"] = max(peak["load"], (await root.get("/load")).json()["server_load"])
            await trio.sleep(0.05)

    done = trio.Event()
    with trio.fail_after(60):
        async with trio.open_nursery() as watcher:
            watcher.start_soon(watch, done)
            async with trio.open_nursery() as streams:
                for _ in range(n_streams):
                    streams.start_soon(one_stream)
            done.set()
    assert statuses == [200] * n_streams
    assert finishes == ["length"] * n_streams
    assert peak["running"] == 4, peak
    assert peak["waiting"] >= 1, peak
    assert peak["load"] >= 5, peak
