"""The gateway's own spans (issue 44), end to end: a real gateway exporting over OTLP/HTTP to a
receiver that decodes the protocol's own messages (tests/otlp_receiver.py), requests from the
official SDKs. Attributes by name, parent links, the trace sent upstream, sampling, and content
only when asked for."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anthropic
import httpx
import openai
import pytest
import trio_websocket

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
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan, running_receiver
from trio_gateway.core.events_codec import TERMINAL_TYPES
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.sim import SimHandle

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SECRET_PROMPT = "the secret word is pumpernickel"


def tracing_toml(receiver: OtlpReceiver, extra: str = "") -> str:
    return f"""
[tracing]
otlp_endpoint = "{receiver.url}"
export_interval_s = 0.05
{extra}
"""


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with running_receiver() as running:
        yield running


@asynccontextmanager
async def traced(
    receiver: OtlpReceiver, extra: str = "", providers: str | None = None
) -> AsyncIterator[tuple[SimHandle, GatewayHandle]]:
    async with running_sim(FAST_SIM) as sim:
        config = gateway_config(
            providers or provider_toml("sim-a", sim.base_url),
            server=tracing_toml(receiver, extra),
        )
        async with running_gateway(config) as gateway:
            yield sim, gateway


async def spans_of(receiver: OtlpReceiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    await wait_until(lambda: len([s for s in receiver.spans() if s.trace_id == trace_id]) >= count)
    return [s for s in receiver.spans() if s.trace_id == trace_id]


def one(spans: list[ReceivedSpan], kind: str) -> ReceivedSpan:
    found = [s for s in spans if s.kind == kind]
    assert len(found) == 1, [(s.kind, s.name) for s in spans]
    return found[0]


async def test_a_streamed_chat_is_one_server_span_with_its_attempt_as_child(
    receiver: OtlpReceiver,
) -> None:
    async with traced(receiver) as (sim, gateway):
        client = openai.AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="unused")
        stream = await client.chat.completions.create(
            model="agent-lite",
            messages=[{"role": "user", "content": SECRET_PROMPT}],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=40,
            temperature=0.5,
            top_p=0.9,
            extra_headers={
                "traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01",
                "x-request-id": "traced-1",
            },
        )
        chunks = [chunk async for chunk in stream]
        usage = chunks[-1].usage
        assert usage is not None
        spans = await spans_of(receiver, TRACE, 2)
    server, attempt = one(spans, "SERVER"), one(spans, "CLIENT")
    assert server.service == "trio-gateway"
    assert server.name == "chat agent-lite"
    assert server.parent_id == CLIENT_SPAN
    assert attempt.parent_id == server.span_id
    # The traceparent sent upstream names the attempt's span: vLLM's span is its child.
    sent = sim.engine.stats().last_request_headers[0]["traceparent"]
    assert sent == f"00-{TRACE}-{attempt.span_id}-01"
    a = server.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "vllm"
    assert a["gen_ai.request.model"] == "agent-lite"
    assert a["gen_ai.response.model"] == "qwen3-32b"
    assert a["gen_ai.request.max_tokens"] == 40
    assert a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.request.top_p"] == 0.9
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.usage.input_tokens"] == usage.prompt_tokens > 0
    assert a["gen_ai.usage.output_tokens"] == usage.completion_tokens > 0
    assert a["gen_ai.response.finish_reasons"] == (chunks[-2].choices[0].finish_reason,)
    assert a["gen_ai.response.id"] == chunks[0].id == "chatcmpl-traced-1"
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    assert a["trio_gateway.outcome"] == "completed"
    assert a["trio_gateway.cancelled"] is False
    assert a["trio_gateway.provider"] == "sim-a"
    assert a["trio_gateway.priority"] == 0
    assert a["http.response.status_code"] == 200
    assert "trio_gateway.code" not in a and "error.type" not in a
    assert server.status_code == "UNSET"
    assert server.event_names()[:1] == ["admitted"]
    first_token = server.event("first_token")
    assert server.start_ns < first_token.time_ns < server.end_ns
    # No content unless asked for.
    assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a
    assert all(SECRET_PROMPT not in str(s) for s in spans)
    b = attempt.attributes
    assert attempt.name == "chat qwen3-32b"
    assert b["gen_ai.provider.name"] == "vllm"
    assert b["gen_ai.request.model"] == "qwen3-32b"
    assert b["trio_gateway.provider"] == "sim-a"
    assert b["server.address"] == "127.0.0.1"
    assert b["server.port"] == int(sim.base_url.rsplit(":", 1)[1])
    assert b["http.response.status_code"] == 200
    assert 0 < b["trio_gateway.time_to_headers_s"] < 5
    assert attempt.status_code == "UNSET"
    assert server.start_ns <= attempt.start_ns <= attempt.end_ns <= server.end_ns


async def test_without_a_traceparent_the_gateway_starts_the_trace(
    receiver: OtlpReceiver,
) -> None:
    async with traced(receiver) as (sim, gateway), httpx.AsyncClient(timeout=20) as client:
        response = await client.post(gateway.base_url + "/v1/chat/completions", json=chat())
        assert response.status_code == 200
        sent = sim.engine.stats().last_request_headers[0]["traceparent"]
        _, trace, parent, flags = sent.split("-")
        spans = await spans_of(receiver, trace, 2)
    server, attempt = one(spans, "SERVER"), one(spans, "CLIENT")
    assert server.parent_id is None
    assert attempt.span_id == parent
    assert int(flags, 16) & 1  # sampled (the SDK also sets W3C level 2's random-id bit)
    assert attempt.parent_id == server.span_id


async def test_every_front_has_its_server_span(receiver: OtlpReceiver) -> None:
    async with traced(receiver) as (_, gateway):
        base = gateway.base_url
        openai_client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused")
        await openai_client.completions.create(model="agent-lite", prompt="hi", max_tokens=5)
        answered = await openai_client.responses.create(model="agent-lite", input="hi")
        claude = anthropic.AsyncAnthropic(base_url=base, api_key="unused")
        await claude.messages.create(
            model="agent-lite", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
        )
        await claude.messages.count_tokens(
            model="agent-lite", messages=[{"role": "user", "content": "hi"}]
        )
        async with httpx.AsyncClient(timeout=20) as client:
            events = await client.post(base + "/v1/events", json=chat())
            assert events.status_code == 200
        async with trio_websocket.open_websocket_url(base.replace("http", "ws") + "/v1/ws") as ws:
            await ws.send_message(json.dumps({"type": "request", "id": "w1", "body": chat()}))
            while (message := json.loads(await ws.get_message()))["type"] not in TERMINAL_TYPES:
                pass
            assert message["type"] == "response.done", message
        await wait_until(lambda: len([s for s in receiver.spans() if s.kind == "SERVER"]) >= 6)
    servers = {
        s.attributes["trio_gateway.route"]: s for s in receiver.spans() if s.kind == "SERVER"
    }
    assert set(servers) == {
        "POST /v1/completions",
        "POST /v1/responses",
        "POST /v1/messages",
        "POST /v1/messages/count_tokens",
        "POST /v1/events",
        "WS /v1/ws",
    }
    assert servers["POST /v1/completions"].name == "text_completion agent-lite"
    assert servers["POST /v1/completions"].attributes["trio_gateway.endpoint"] == "completions"
    assert servers["POST /v1/responses"].attributes["trio_gateway.endpoint"] == "responses"
    assert servers["POST /v1/responses"].attributes["gen_ai.response.id"] == answered.id
    assert servers["POST /v1/messages"].attributes["trio_gateway.endpoint"] == "messages"
    assert servers["WS /v1/ws"].attributes["gen_ai.operation.name"] == "chat"
    for route in ("POST /v1/completions", "POST /v1/messages", "POST /v1/events", "WS /v1/ws"):
        assert servers[route].attributes["gen_ai.usage.output_tokens"] > 0, route
    counted = servers["POST /v1/messages/count_tokens"]
    assert counted.attributes["http.response.status_code"] == 200
    assert counted.attributes["gen_ai.request.model"] == "agent-lite"
    # Each relayed request's attempt is a child of its server span.
    by_id = {s.span_id: s for s in receiver.spans()}
    attempts = [s for s in receiver.spans() if s.kind == "CLIENT"]
    assert len(attempts) == 5
    assert all(by_id[a.parent_id or ""].kind == "SERVER" for a in attempts)


async def test_each_create_on_a_responses_socket_is_a_span_of_the_agents_trace(
    receiver: OtlpReceiver,
) -> None:
    """The Responses API's WebSocket mode: each ``response.create`` a server span, a child of
    the handshake's traceparent, with its own resp_ id; a continuation the socket cannot find
    is a span with its code."""
    async with traced(receiver) as (_, gateway):
        url = gateway.base_url.replace("http", "ws") + "/v1/responses"
        headers = [(b"traceparent", f"00-{TRACE}-{CLIENT_SPAN}-01".encode())]
        ids: list[str] = []
        async with trio_websocket.open_websocket_url(url, extra_headers=headers) as ws:
            for previous in (None, "first", "resp_unknown"):
                create: dict[str, object] = {
                    "type": "response.create",
                    "model": "agent-lite",
                    "input": "hi",
                    "store": False,
                }
                if previous is not None:
                    create["previous_response_id"] = ids[0] if previous == "first" else previous
                await ws.send_message(json.dumps(create))
                while (event := json.loads(await ws.get_message()))["type"] not in (
                    "response.completed",
                    "error",
                ):
                    pass
                if event["type"] == "error":
                    assert event["error"]["code"] == "previous_response_not_found", event
                else:
                    ids.append(event["response"]["id"])
        spans = await spans_of(receiver, TRACE, 5)
    servers = sorted((s for s in spans if s.kind == "SERVER"), key=lambda s: s.start_ns)
    assert [s.attributes["trio_gateway.route"] for s in servers] == ["WS /v1/responses"] * 3
    assert all(s.parent_id == CLIENT_SPAN for s in servers)
    assert [s.attributes.get("gen_ai.response.id") for s in servers[:2]] == ids
    assert all(s.attributes["trio_gateway.endpoint"] == "responses_ws" for s in servers[:2])
    assert all(s.attributes["gen_ai.usage.output_tokens"] > 0 for s in servers[:2])
    refused = servers[2].attributes
    assert refused["trio_gateway.outcome"] == "refused"
    assert refused["trio_gateway.code"] == "response_not_found"
    # The two answered creates went upstream, each under its own span.
    attempts = [s for s in spans if s.kind == "CLIENT"]
    assert sorted(a.parent_id or "" for a in attempts) == sorted(s.span_id for s in servers[:2])


async def test_a_refused_request_says_its_code(receiver: OtlpReceiver) -> None:
    async with traced(receiver) as (_, gateway), httpx.AsyncClient(timeout=20) as client:
        response = await client.post(
            gateway.base_url + "/v1/chat/completions",
            json={"model": "agent-lite", "messages": "nope"},
            headers={"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"},
        )
        assert response.status_code == 400
        (server,) = await spans_of(receiver, TRACE, 1)
    a = server.attributes
    assert a["trio_gateway.outcome"] == "refused"
    assert a["trio_gateway.code"] == a["error.type"] == "invalid_request"
    assert a["gen_ai.request.model"] == "agent-lite"
    assert a["http.response.status_code"] == 400
    assert "gen_ai.usage.input_tokens" not in a


async def test_a_failover_is_an_event_and_a_failed_attempt(receiver: OtlpReceiver) -> None:
    async with running_sim(FAST_SIM) as sim:
        providers = provider_toml(
            "down", "http://127.0.0.1:9", extra="connect_timeout_s = 1.0"
        ) + provider_toml("sim-a", sim.base_url, weight=1)
        config = gateway_config(providers, server=tracing_toml(receiver))
        async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=20) as client:
            response = await client.post(
                gateway.base_url + "/v1/chat/completions",
                json=chat(),
                headers={"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"},
            )
            assert response.status_code == 200
            spans = await spans_of(receiver, TRACE, 3)
    server = one(spans, "SERVER")
    failed, answered = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start_ns)
    assert failed.attributes["trio_gateway.provider"] == "down"
    assert failed.attributes["error.type"] == "upstream_unreachable"
    assert failed.status_code == "ERROR"
    assert answered.attributes["trio_gateway.provider"] == "sim-a"
    assert server.event("failover").attributes == {
        "trio_gateway.from": "down",
        "trio_gateway.to": "sim-a",
    }
    assert server.attributes["trio_gateway.provider"] == "sim-a"


async def test_a_client_that_leaves_is_a_cancelled_span(receiver: OtlpReceiver) -> None:
    async with traced(receiver) as (_, gateway), httpx.AsyncClient(timeout=20) as client:
        slow = script({"text": "first"}, {"delay_s": 30}, {"text": "never"})
        async with client.stream(
            "POST",
            gateway.base_url + "/v1/chat/completions",
            json=chat(slow, stream=True),
            headers={"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"},
        ) as response:
            async for _ in response.aiter_bytes():
                break  # the first chunk, then leave
        server, attempt = await spans_of(receiver, TRACE, 2)
    server, attempt = sorted((server, attempt), key=lambda s: s.kind != "SERVER")
    assert server.attributes["trio_gateway.outcome"] == "cancelled"
    assert server.attributes["trio_gateway.cancelled"] is True
    assert server.attributes["trio_gateway.code"] == "client_gone"
    assert "error.type" not in server.attributes
    assert attempt.attributes["trio_gateway.cancelled"] is True


async def test_sampling_follows_the_client_and_the_ratio(receiver: OtlpReceiver) -> None:
    unsampled_trace = "5d0e2a7c9b3f4e18a6c1d2b3e4f50617"
    async with (
        traced(receiver, "sample_ratio = 0.0") as (sim, gateway),
        httpx.AsyncClient(timeout=20) as client,
    ):
        url = gateway.base_url + "/v1/chat/completions"
        # A sampled client trace is recorded whatever the ratio.
        sampled = {"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"}
        assert (await client.post(url, json=chat(), headers=sampled)).status_code == 200
        # An unsampled one never; the gateway's ids go upstream, unsampled.
        unsampled = {"traceparent": f"00-{unsampled_trace}-{CLIENT_SPAN}-00"}
        assert (await client.post(url, json=chat(), headers=unsampled)).status_code == 200
        # A new trace at ratio 0: not recorded, and vLLM is told so.
        assert (await client.post(url, json=chat())).status_code == 200
        await spans_of(receiver, TRACE, 2)
        # One more sampled request: once it is in, the two before it would have been too.
        again = {"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"}
        assert (await client.post(url, json=chat(), headers=again)).status_code == 200
        await spans_of(receiver, TRACE, 4)
    sent = [h["traceparent"] for h in sim.engine.stats().last_request_headers[:4]]
    assert {s.trace_id for s in receiver.spans()} == {TRACE}
    _, trace, parent, flags = sent[1].split("-")
    assert trace == unsampled_trace and parent != CLIENT_SPAN
    assert not int(flags, 16) & 1
    assert not int(sent[2].split("-")[3], 16) & 1


async def test_content_only_when_asked_for(receiver: OtlpReceiver) -> None:
    async with (
        traced(receiver, "capture_content = true") as (_, gateway),
        httpx.AsyncClient(timeout=20) as client,
    ):
        response = await client.post(
            gateway.base_url + "/v1/chat/completions",
            json=chat(SECRET_PROMPT + script({"text": "rye bread"}), stream=True),
            headers={"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"},
        )
        assert response.status_code == 200
        spans = await spans_of(receiver, TRACE, 2)
    server = one(spans, "SERVER")
    given = json.loads(server.attributes["gen_ai.input.messages"])
    assert given[0]["role"] == "user"
    assert given[0]["parts"][0]["type"] == "text"
    assert SECRET_PROMPT in given[0]["parts"][0]["content"]
    answered = json.loads(server.attributes["gen_ai.output.messages"])
    assert answered[0]["role"] == "assistant"
    assert answered[0]["parts"][0] == {"type": "text", "content": "rye bread"}
    assert answered[0]["finish_reason"] == "stop"
    # Content is the server span's alone.
    assert SECRET_PROMPT not in str(one(spans, "CLIENT"))
