"""The gateway in front of a real vLLM 0.32 (CPU, tiny random Qwen3): what issue 3 asks of it.

Each test runs the gateway in-process on a free port with one provider, `vllm`, pointing at the
session's real server (tests/vllm/helpers.py), and talks to it with the official openai SDK or
raw httpx. The tiny model never stops by itself (unforced answers run to max_tokens) and writes
exactly what a `structured_outputs.regex` spells, `<think>` / `<tool_call>` included, so vLLM's
reasoning and tool parsers see what a real Qwen3 writes (see test_vllm_raw.py). The regex is a
vLLM extension field: that the forced shapes come out proves the gateway passes it untouched.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import openai
import pytest
import trio
from openai import AsyncOpenAI

from tests.e2e.harness import provider_toml, running_gateway, wait_until
from tests.vllm.helpers import (
    ALIAS,
    KEY_ENV,
    PROVIDER,
    TOOL_CALL_RE,
    WEATHER_TOOL,
    metric,
    prom_value,
    vllm_gateway,
    wait_generation_settled,
    wait_load,
    wait_metric,
)
from tests.vllm.vllm_server import VllmServer
from tests.vllm.wire_shape import Transcript, kinds_of
from trio_gateway.capacity.health import State
from trio_gateway.config.load import parse_config
from trio_gateway.process.serve import GatewayHandle

pytestmark = pytest.mark.vllm

Json = dict[str, Any]

REASONING_RE = "<think>abc</think>\n\nhello"
PROMPT = "what is the weather in paris"
TOO_LONG = "hello world weather " * 300  # 2400 tokens for the tiny model's tokenizer


def messages(content: str = PROMPT) -> Any:
    return [{"role": "user", "content": content}]


def chat(content: str = PROMPT, **fields: Any) -> Json:
    return {"model": ALIAS, "messages": messages(content), **fields}


def regex(pattern: str) -> Json:
    """vLLM's structured outputs: the tiny model writes exactly this (temperature 0)."""
    return {"structured_outputs": {"regex": pattern}}


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
async def gateway(vllm_server: VllmServer) -> AsyncIterator[GatewayHandle]:
    async with vllm_gateway(vllm_server) as handle:
        yield handle


@pytest.fixture
async def sdk(gateway: GatewayHandle) -> AsyncIterator[AsyncOpenAI]:
    client = AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0)
    yield client
    await client.close()


@pytest.fixture
async def gw(gateway: GatewayHandle) -> AsyncIterator[httpx.AsyncClient]:
    """Raw httpx against the gateway (root URL: /v1/..., /metrics, /readyz)."""
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=120.0) as client:
        yield client


@pytest.fixture
async def root(vllm_server: VllmServer) -> AsyncIterator[httpx.AsyncClient]:
    """vLLM itself, without a key: /metrics and /load."""
    async with httpx.AsyncClient(base_url=vllm_server.root_url, timeout=30.0) as client:
        yield client


async def post(client: httpx.AsyncClient, body: Json) -> Transcript:
    """POST /v1/chat/completions and capture the whole answer (stream or not)."""
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        text = (await resp.aread()).decode()
    return Transcript.from_http(resp.status_code, resp.headers.get("content-type"), text)


def chunks_of(transcript: Transcript) -> list[Json]:
    assert transcript.status == 200, transcript.text
    assert transcript.events is not None and transcript.events[-1] == "[DONE]"
    return [e for e in transcript.events if isinstance(e, dict)]


def joined(chunks: list[Json], key: str) -> str:
    return "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks if c["choices"])


def gateway_tokens(gateway: GatewayHandle, kind: str) -> float:
    """The gateway's token counter (as on its /metrics), read in-process."""
    labels = {"alias": ALIAS, "provider": PROVIDER, "kind": kind}
    value = gateway.router.metrics.registry.get_sample_value("gateway_tokens_total", labels)
    return value or 0.0


async def tokens_counted(gateway: GatewayHandle, kind: str, *, since: float) -> float:
    """Wait until the gateway counted tokens beyond `since`; return how many more."""
    await wait_until(lambda: gateway_tokens(gateway, kind) > since)
    return gateway_tokens(gateway, kind) - since


# --- streaming, usage ------------------------------------------------------------------------


async def test_sdk_stream_forwards_the_usage_chunk_when_asked(sdk: AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model=ALIAS,
        messages=messages(),
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"reasoning": False},
    )
    chunks = [chunk async for chunk in stream]
    *answer, last = chunks
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 8  # the tiny model runs to max_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + 8
    assert all(c.usage is None for c in answer), "exactly one usage chunk, the last"
    assert all(c.model == ALIAS for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in answer)
    assert text, "thinking is off: the answer is content"
    assert [c.choices[0].finish_reason for c in answer if c.choices[0].finish_reason] == ["length"]


async def test_stream_without_include_usage_has_no_usage_but_the_gateway_counted_it(
    gw: httpx.AsyncClient, gateway: GatewayHandle
) -> None:
    """The gateway always asks vLLM for usage; the client that did not ask never sees it."""
    no_usage: list[Json] = [{}, {"stream_options": {"include_usage": False}}]
    for options in no_usage:
        before = gateway_tokens(gateway, "completion")
        body = chat(max_tokens=8, temperature=0, stream=True, reasoning=False, **options)
        transcript = await post(gw, body)
        chunks = chunks_of(transcript)
        assert kinds_of(transcript.events or ()) == ("role", "content", "finish", "done")
        assert not any("usage" in c for c in chunks)
        # vLLM sends usage in a stream only when asked: the gateway asked, and counts it
        # once the request is over (just after the client got [DONE]).
        assert await tokens_counted(gateway, "completion", since=before) == 8


async def test_raw_stream_wire_with_usage(gw: httpx.AsyncClient) -> None:
    transcript = await post(
        gw,
        chat(max_tokens=8, stream=True, stream_options={"include_usage": True}),
    )
    chunks = chunks_of(transcript)
    assert transcript.media_type == "text/event-stream"
    # Thinking on (vLLM's default): all of it is reasoning, renamed for the OpenAI front.
    assert kinds_of(transcript.events or ()) == ("role", "reasoning", "finish", "usage", "done")
    assert not any("reasoning" in c["choices"][0]["delta"] for c in chunks if c["choices"])
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 8
    assert type(usage["completion_tokens_details"]["reasoning_tokens"]) is int
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")


async def test_non_stream_is_assembled_from_the_upstream_stream(sdk: AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(
        model=ALIAS, messages=messages(), max_tokens=8, temperature=0
    )
    choice = completion.choices[0]
    assert completion.model == ALIAS and completion.object == "chat.completion"
    assert choice.finish_reason == "length"
    assert choice.message.content is None  # thinking on: everything was reasoning
    reasoning = getattr(choice.message, "reasoning_content", None)
    assert isinstance(reasoning, str) and reasoning
    # Usage on a non-stream answer built from a stream: only there because the gateway
    # asked vLLM for it (stream_options.include_usage upstream).
    assert completion.usage is not None and completion.usage.completion_tokens == 8


# --- reasoning ---------------------------------------------------------------------------


async def test_reasoning_is_split_from_content(sdk: AsyncOpenAI, gw: httpx.AsyncClient) -> None:
    stream = await sdk.chat.completions.create(
        model=ALIAS,
        messages=messages(),
        max_tokens=60,
        temperature=0,
        stream=True,
        extra_body=regex(REASONING_RE),
    )
    reasoning, content = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            content.append(choice.delta.content or "")
    assert "".join(reasoning) == "abc"
    assert "".join(content).strip() == "hello"
    # On the wire: every reasoning delta before the first content delta.
    transcript = await post(
        gw, chat(max_tokens=60, temperature=0, stream=True, **regex(REASONING_RE))
    )
    assert kinds_of(transcript.events or ()) == ("role", "reasoning", "content", "finish", "done")

    completion = await sdk.chat.completions.create(
        model=ALIAS,
        messages=messages(),
        max_tokens=60,
        temperature=0,
        extra_body=regex(REASONING_RE),
    )
    message = completion.choices[0].message
    assert getattr(message, "reasoning_content", None) == "abc"
    assert (message.content or "").strip() == "hello"
    assert completion.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("switch", [{"reasoning": False}, {"reasoning_effort": "none"}])
async def test_thinking_switched_off(
    switch: Json, gw: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    transcript = await post(gw, chat(max_tokens=8, temperature=0, **switch))
    assert transcript.status == 200, transcript.text
    body = transcript.body
    message = body["choices"][0]["message"]
    assert "reasoning_content" not in message and isinstance(message["content"], str)
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    # The switch reached vLLM as chat_template_kwargs.enable_thinking=false: the prompt is the
    # one vLLM renders with the empty think block pre-filled, token for token.
    async with httpx.AsyncClient(
        base_url=vllm_server.base_url, headers=vllm_server.auth_headers, timeout=60
    ) as direct:

        async def prompt_tokens(thinking: bool) -> int:
            resp = await direct.post(
                "/chat/completions",
                json={
                    "model": vllm_server.served_model_name,
                    "messages": messages(),
                    "max_tokens": 1,
                    "chat_template_kwargs": {"enable_thinking": thinking},
                },
            )
            tokens: int = resp.json()["usage"]["prompt_tokens"]
            return tokens

        off, on = await prompt_tokens(False), await prompt_tokens(True)
    assert off != on
    assert body["usage"]["prompt_tokens"] == off


# --- tool calls --------------------------------------------------------------------------


async def test_tool_call_fragments_stream_through(sdk: AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model=ALIAS,
        messages=messages(),
        max_tokens=60,
        temperature=0,
        stream=True,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        reasoning_effort="none",
        extra_body=regex(TOOL_CALL_RE),
    )
    fragments: list[Any] = []
    finish = None
    async for chunk in stream:
        for choice in chunk.choices:
            fragments.extend(choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert len(fragments) >= 3, "fragments are relayed as they come, not buffered"
    first, rest = fragments[0], fragments[1:]
    assert first.id.startswith("chatcmpl-tool-") and first.type == "function"
    assert first.index == 0 and first.function.name == "get_weather"
    assert all(f.index == 0 and f.id is None and f.function.name is None for f in rest)
    arguments = (first.function.arguments or "") + "".join(f.function.arguments for f in rest)
    assert json.loads(arguments) == {"city": "x"}


async def test_tool_call_non_stream_is_assembled(sdk: AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(
        model=ALIAS,
        messages=messages(),
        max_tokens=60,
        temperature=0,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        reasoning_effort="none",
        extra_body=regex(TOOL_CALL_RE),
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "x"}


async def test_reasoning_then_tool_call(gw: httpx.AsyncClient) -> None:
    # Thinking first, then the call: reasoning deltas, the "\n\n" Qwen3 writes after
    # </think> as content, then the call's fragments.
    body = chat(
        max_tokens=80,
        temperature=0,
        stream=True,
        tools=[WEATHER_TOOL],
        **regex("<think>abc</think>\n\n" + TOOL_CALL_RE),
    )
    transcript = await post(gw, body)
    chunks = chunks_of(transcript)
    assert kinds_of(transcript.events or ()) == (
        *("role", "reasoning", "content", "tool_first", "tool_args", "finish", "done"),
    )
    assert joined(chunks, "reasoning_content") == "abc"
    # Not streamed: the whitespace before the call is no content, as in vLLM's own answer.
    whole = await gw.post("/v1/chat/completions", json={**body, "stream": False})
    message = whole.json()["choices"][0]["message"]
    assert message["content"] is None
    assert message["reasoning_content"] == "abc"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "x"}


# --- errors ------------------------------------------------------------------------------


async def test_context_length_exceeded(sdk: AsyncOpenAI, gw: httpx.AsyncClient) -> None:
    """vLLM says 400 BadRequestError param input_tokens; the client gets one error code."""
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as raised:
            await sdk.chat.completions.create(
                model=ALIAS, messages=messages(TOO_LONG), max_tokens=10, stream=stream
            )
        assert raised.value.code == "context_length_exceeded"
        transcript = await post(gw, chat(TOO_LONG, max_tokens=10, stream=stream))
        assert transcript.status == 400 and transcript.media_type == "application/json"
        error = transcript.body["error"]
        assert set(error) == {"message", "type", "code", "param", "provider"}
        assert error["code"] == "context_length_exceeded"
        assert error["type"] == "invalid_request_error"
        assert error["param"] == "input_tokens" and error["provider"] == PROVIDER
        assert "maximum context length is 2048 tokens" in error["message"]


async def test_max_tokens_over_the_model_length_is_an_invalid_request(
    gw: httpx.AsyncClient,
) -> None:
    transcript = await post(gw, chat(max_tokens=3000))
    assert transcript.status == 400
    error = transcript.body["error"]
    assert error["code"] == "invalid_request" and error["param"] == "max_tokens"
    assert "max_model_len=2048" in error["message"] and error["provider"] == PROVIDER


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
