"""End to end: `serve_sim` on a free port, real httpx over real sockets."""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from trio_gateway.sim import SimConfig, serve_sim

from .conftest import StartSim
from .helpers import fixture_request, misc_errors, sse_payloads

PARIS = [{"role": "user", "content": "hello, what is the weather in paris"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
KEY = "sk-test"


def scripted(*steps: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"go <sim>{json.dumps({'steps': list(steps)})}</sim>"}]


async def post_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    """The parsed `data:` payloads of a streamed answer (`[DONE]` kept as a string)."""
    async with client.stream(
        "POST", url + "/v1/chat/completions", json={**body, "stream": True}
    ) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        text = (await r.aread()).decode()
    return [p if p == "[DONE]" else json.loads(p) for p in sse_payloads(text)]


def deltas(events: list[Any], field: str) -> str:
    return "".join(
        c["delta"].get(field) or "" for e in events if isinstance(e, dict) for c in e["choices"]
    )


async def test_non_stream_answer(start_sim: StartSim, client: httpx.AsyncClient) -> None:
    sim = await start_sim()
    r = await client.post(sim.base_url + "/v1/chat/completions", json={"messages": PARIS})
    assert r.status_code == 200
    body = r.json()
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", body["id"])
    message = body["choices"][0]["message"]
    assert message["reasoning"] and message["content"].startswith("\n\n")
    assert body["choices"][0]["finish_reason"] == "stop"
    # 1 + 8 reasoning + 1 + blank line + 16 + EOS; the fixture's prompt count for this question.
    assert body["usage"] == {
        "prompt_tokens": 17,
        "total_tokens": 17 + 28,
        "completion_tokens": 28,
        "prompt_tokens_details": None,
        "completion_tokens_details": {"reasoning_tokens": 8},
    }
    again = await client.post(sim.base_url + "/v1/chat/completions", json={"messages": PARIS})
    assert again.json()["choices"] == body["choices"]


async def test_the_fixture_requests_are_understood(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim(max_model_len=2048, default_text_tokens=100)
    for name in ("a_nonstream_thinking_False.json", "c_user_store_metadata.json"):
        request = fixture_request(name)
        r = await client.post(sim.base_url + "/v1/chat/completions", json=request)
        body = r.json()
        assert body["usage"]["completion_tokens"] == request["max_tokens"]
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["choices"][0]["message"]["reasoning"] is None


@pytest.mark.parametrize("include_usage", [None, False, True])
async def test_usage_chunk_only_when_asked(
    start_sim: StartSim, client: httpx.AsyncClient, include_usage: bool | None
) -> None:
    sim = await start_sim()
    body: dict[str, Any] = {"messages": PARIS, "max_tokens": 8}
    if include_usage is not None:
        body["stream_options"] = {"include_usage": include_usage}
    events = await post_stream(client, sim.base_url, body)
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    usage_chunks = [e for e in events[:-1] if e["choices"] == []]
    if include_usage:
        assert len(usage_chunks) == 1 and events[-2] is usage_chunks[0]
        assert usage_chunks[0]["usage"]["completion_tokens"] == 8
        assert "system_fingerprint" in events[-2] and "system_fingerprint" not in events[-3]
    else:
        assert usage_chunks == []
        assert "system_fingerprint" in events[-2]
    assert events[-2 if not include_usage else -3]["choices"][0]["finish_reason"] == "length"


async def test_continuous_usage_on_every_chunk(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim()
    options = {"include_usage": True, "continuous_usage_stats": True}
    events = await post_stream(client, sim.base_url, {"messages": PARIS, "stream_options": options})
    counts = [e["usage"]["completion_tokens"] for e in events[:-1]]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == counts[-2] == 28


async def test_reasoning_then_content_then_thinking_off(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim()
    messages = scripted({"reasoning": "let me think"}, {"text": "Hello 世界 🌍"})
    events = await post_stream(client, sim.base_url, {"messages": messages})
    assert deltas(events, "reasoning") == "let me think"
    assert deltas(events, "content") == "\n\nHello 世界 🌍"
    kinds = [next(iter(c["delta"]), "") for e in events[1:-1] for c in e["choices"]]
    assert kinds == ["reasoning"] * 3 + ["content"] * 5 + [""]
    off = {"messages": messages, "chat_template_kwargs": {"enable_thinking": False}}
    events = await post_stream(client, sim.base_url, off)
    assert deltas(events, "reasoning") == "" and deltas(events, "content") == "Hello 世界 🌍"


async def test_tool_call_fragments(start_sim: StartSim, client: httpx.AsyncClient) -> None:
    sim = await start_sim()
    messages = scripted(
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
        {"tool_call": {"name": "get_time", "arguments": {"tz": "東京"}}},
    )
    events = await post_stream(client, sim.base_url, {"messages": messages, "tools": TOOLS})
    fragments = [
        (e["choices"][0]["delta"], tc)
        for e in events[1:-1]
        for tc in e["choices"][0]["delta"].get("tool_calls", [])
    ]
    firsts = [tc for delta, tc in fragments if "id" in tc]
    assert [(tc["index"], tc["function"]) for tc in firsts] == [
        (0, {"name": "get_weather"}),
        (1, {"name": "get_time"}),
    ]
    assert all(re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", tc["id"]) for tc in firsts)
    assert all(delta["content"] is None for delta, _ in fragments)
    rest = [tc for _, tc in fragments if "id" not in tc]
    assert all(set(tc) == {"index", "function"} for tc in rest)
    arguments = [
        "".join(tc["function"]["arguments"] for tc in rest if tc["index"] == i) for i in (0, 1)
    ]
    assert [json.loads(a) for a in arguments] == [{"city": "Zürich"}, {"tz": "東京"}]
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
    r = await client.post(
        sim.base_url + "/v1/chat/completions", json={"messages": messages, "tools": TOOLS}
    )
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Zürich"},
        {"tz": "東京"},
    ]


async def test_auth_and_errors_as_vllm(start_sim: StartSim, client: httpx.AsyncClient) -> None:
    sim = await start_sim(api_key=KEY, max_model_len=2048)
    errors = misc_errors()
    url = sim.base_url + "/v1/chat/completions"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = await client.post(url, json={"messages": PARIS}, headers=headers)
        assert (r.status_code, r.text) == errors["no key"]
    r = await client.get(sim.base_url + "/v1/models")
    assert (r.status_code, r.text) == errors["/v1/models no key"]
    for path in ("/health", "/metrics", "/load"):
        assert (await client.get(sim.base_url + path)).status_code == 200
    auth = {"Authorization": f"Bearer {KEY}"}
    cases = {
        "unknown model": {"model": "other-model", "messages": PARIS},
        "max_tokens 3000 > max_model_len": {"messages": PARIS, "max_tokens": 3000},
        "prompt > max_model_len": {"messages": [{"role": "user", "content": "hello " * 3000}]},
    }
    for title, body in cases.items():
        r = await client.post(url, json=body, headers=auth)
        assert (r.status_code, r.text) == errors[title]
    r = await client.post(url, content=b"{", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    models = (await client.get(sim.base_url + "/v1/models", headers=auth)).json()
    assert [m["id"] for m in models["data"]] == ["qwen3-32b"]
    assert models["data"][0]["max_model_len"] == 2048
    assert (await client.get(sim.base_url + "/nope")).status_code == 404
    assert (await client.get(url, headers=auth)).status_code == 405
    assert sim.engine.stats().errors == 4


async def test_auto_tool_choice_without_parser(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim(tool_call_parser=False)
    body = {"messages": PARIS, "tools": TOOLS, "tool_choice": "auto"}
    r = await client.post(sim.base_url + "/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert "--enable-auto-tool-choice" in r.json()["error"]["message"]


async def test_disconnect_mid_stream_aborts(start_sim: StartSim, client: httpx.AsyncClient) -> None:
    sim = await start_sim()
    body = {"messages": PARIS, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    async with client.stream("POST", sim.base_url + "/v1/chat/completions", json=body) as r:
        lines = r.aiter_lines()
        for _ in range(10):
            await anext(lines)
    with trio.fail_after(2):
        stats = await sim.engine.wait_until(lambda s: s.aborts == 1)
    assert (stats.running, stats.waiting, stats.disconnects) == (0, 0, 1)
    assert 0 < stats.tokens_generated < 2000
    assert stats.tokens_generated_after_client_left <= 2  # at most a step or two in flight


async def test_non_stream_disconnect_aborts_too(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim(decode_step_s=0.01)
    body = {"messages": PARIS, "max_tokens": 1000, "ignore_eos": True}
    # The client leaves once the sim runs its request: a fixed delay instead was, on a loaded
    # machine, sometimes shorter than the request's way there, and nothing was aborted.
    async with trio.open_nursery() as nursery:
        url = sim.base_url + "/v1/chat/completions"
        nursery.start_soon(partial(client.post, url, json=body))
        with trio.fail_after(5):
            await sim.engine.wait_until(lambda s: s.running == 1)
        nursery.cancel_scope.cancel()
    with trio.fail_after(2):
        stats = await sim.engine.wait_until(lambda s: s.aborts == 1)
    assert stats.running == 0 and stats.tokens_generated < 1000


async def test_without_abort_on_disconnect_tokens_are_wasted(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim(abort_on_disconnect=False)
    body = {"messages": PARIS, "max_tokens": 300, "ignore_eos": True, "stream": True}
    async with client.stream("POST", sim.base_url + "/v1/chat/completions", json=body) as r:
        await anext(r.aiter_lines())
    with trio.fail_after(5):
        stats = await sim.engine.wait_until(lambda s: s.finished == 1)
    assert stats.aborts == 0 and stats.tokens_generated == 300
    assert stats.tokens_generated_after_client_left > 100


async def test_max_num_seqs_under_load_with_load_and_metrics(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim(max_num_seqs=2, decode_step_s=0.002)
    results: list[int] = []

    async def one(i: int) -> None:
        body = {
            "messages": [{"role": "user", "content": f"q{i}"}],
            "max_tokens": 60,
            "ignore_eos": True,
        }
        r = await client.post(sim.base_url + "/v1/chat/completions", json=body)
        results.append(r.json()["usage"]["completion_tokens"])

    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(one, i)
        with trio.fail_after(5):
            await sim.engine.wait_until(lambda s: s.running == 2 and s.waiting == 4)
        # Sequences are 60 steps long: the state holds still long enough to read it twice.
        load = (await client.get(sim.base_url + "/load")).json()
        metrics = (await client.get(sim.base_url + "/metrics")).text
        assert load == {"server_load": 6}
        assert 'vllm:num_requests_running{engine="0",model_name="qwen3-32b"} 2.0' in metrics
        assert 'vllm:num_requests_waiting{engine="0",model_name="qwen3-32b"} 4.0' in metrics
    assert results == [60] * 6
    stats = (await client.get(sim.base_url + "/sim/stats")).json()
    assert (stats["max_running_seen"], stats["running"], stats["requests"]) == (2, 0, 6)
    assert stats["max_waiting_seen"] > 0
    metrics = (await client.get(sim.base_url + "/metrics")).text
    assert 'vllm:generation_tokens_total{engine="0",model_name="qwen3-32b"} 360.0' in metrics
    assert (await client.get(sim.base_url + "/load")).json() == {"server_load": 0}


async def test_prefix_cache_counters(start_sim: StartSim, client: httpx.AsyncClient) -> None:
    sim = await start_sim()
    long = [{"role": "user", "content": " ".join(f"w{i}" for i in range(200))}]
    for _ in range(2):
        r = await client.post(
            sim.base_url + "/v1/chat/completions", json={"messages": long, "max_tokens": 1}
        )
    prompt = r.json()["usage"]["prompt_tokens"]
    stats = sim.engine.stats()
    assert stats.prefix_cache_queries == stats.prompt_tokens == 2 * prompt
    assert stats.prefix_cache_hits == (prompt - 1) // 16 * 16


async def test_scripted_faults(start_sim: StartSim, client: httpx.AsyncClient) -> None:
    sim = await start_sim()
    url = sim.base_url + "/v1/chat/completions"
    once = scripted({"status": 503, "retry_after": 2, "times": 1}, {"text": "ok now"})
    r = await client.post(url, json={"messages": once})
    assert (r.status_code, r.headers["retry-after"]) == (503, "2")
    assert r.json()["error"]["code"] == 503
    r = await client.post(url, json={"messages": once})
    assert r.json()["choices"][0]["message"]["content"] == "ok now"
    custom = scripted({"status": 429, "body": {"error": {"message": "slow down"}}})
    r = await client.post(url, json={"messages": custom, "stream": True})
    assert (r.status_code, r.json()) == (429, {"error": {"message": "slow down"}})
    bad = [{"role": "user", "content": "<sim>{nope</sim>"}]
    r = await client.post(url, json={"messages": bad})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sim"


async def test_scripted_drops(start_sim: StartSim, client: httpx.AsyncClient) -> None:
    sim = await start_sim()
    url = sim.base_url + "/v1/chat/completions"
    # More tokens after the drop than the engine may run ahead of its writer (TOKEN_BUFFER):
    # the sequence can never finish before the handler drops it, so both are aborts, whatever
    # the machine's speed. (With a short tail the engine sometimes finished it first.)
    tail = {"text_tokens": 4 * SimConfig().client_lead_tokens}
    messages = scripted({"text": "one two three"}, {"drop": True}, tail)
    received: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        async with client.stream("POST", url, json={"messages": messages, "stream": True}) as r:
            async for line in r.aiter_lines():
                received.append(line)
    assert deltas([json.loads(p) for p in sse_payloads("\n".join(received))], "content") == (
        "one two three"
    )
    with pytest.raises(httpx.RemoteProtocolError):
        await client.post(url, json={"messages": messages})
    with trio.fail_after(10):
        stats = await sim.engine.wait_until(lambda s: s.aborts + s.finished == 2)
    assert (stats.aborts, stats.finished, stats.running) == (2, 0, 0)


async def test_delay_and_split_utf8(start_sim: StartSim, client: httpx.AsyncClient) -> None:
    sim = await start_sim()
    messages = scripted({"split_utf8": True}, {"text": "a"}, {"delay_s": 0.2}, {"text": " é 世界"})
    start = trio.current_time()
    events = await post_stream(client, sim.base_url, {"messages": messages})
    assert trio.current_time() - start >= 0.2
    assert deltas(events, "content") == "a é 世界"


async def test_stats_show_what_was_sent_and_reset(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim(api_key=KEY)
    body = {"messages": PARIS, "max_tokens": 3, "user": "u", "metadata": {"k": "v"}}
    headers = {"Authorization": f"Bearer {KEY}", "X-Request-Id": "abc"}
    await client.post(sim.base_url + "/v1/chat/completions", json=body, headers=headers)
    # By default the recorded requests are counted, not shown: a prompt is not a statistic.
    plain = (await client.get(sim.base_url + "/sim/stats")).json()
    assert plain["recorded_requests"] == 1
    assert not {"last_request_body", "last_request_bodies", "last_request_headers"} & set(plain)
    assert "paris" not in json.dumps(plain)
    stats = (await client.get(sim.base_url + "/sim/stats?bodies=1")).json()
    assert stats["last_request_body"] == body
    assert stats["last_request_headers"][-1]["x-request-id"] == "abc"
    assert stats["last_request_headers"][-1]["authorization"] == "<redacted>"
    assert (stats["requests"], stats["finished"], stats["tokens_generated"]) == (1, 1, 3)
    assert (await client.post(sim.base_url + "/sim/reset")).status_code == 200
    stats = (await client.get(sim.base_url + "/sim/stats?bodies=1")).json()
    assert (stats["requests"], stats["tokens_generated"], stats["last_request_bodies"]) == (
        0,
        0,
        [],
    )


async def test_cancelling_the_caller_stops_everything_quickly(client: httpx.AsyncClient) -> None:
    config = SimConfig(decode_step_s=0.01)
    body = {"messages": PARIS, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with trio.fail_after(2):
        async with trio.open_nursery() as nursery:
            sim = await nursery.start(serve_sim, config)

            async def read_forever() -> None:
                async with client.stream(
                    "POST", sim.base_url + "/v1/chat/completions", json=body
                ) as r:
                    async for _ in r.aiter_lines():
                        pass

            nursery.start_soon(read_forever)
            await sim.engine.wait_until(lambda s: s.tokens_generated > 5)
            nursery.cancel_scope.cancel()
    with pytest.raises(httpx.ConnectError):
        await client.get(sim.base_url + "/health")
