"""``POST /v1/events`` over real sockets: the gateway's own vocabulary as server-sent events."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.harness import Stack, chat, script, wait_until
from tests.e2e.test_cancellation import LONG, wait_for_abort
from trio_gateway.core.sse import SSEDecoder

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def parse_events(raw: bytes) -> list[dict[str, Any]]:
    """Every event, checked to carry its own type as its SSE ``event:`` name."""
    decoder = SSEDecoder()
    events = []
    for sse in [*decoder.feed(raw), *decoder.close()]:
        event = json.loads(sse.data)
        assert sse.event == event["type"]
        events.append(event)
    return events


async def post_events(stack: Stack, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(stack.v1 + "/events", json=body)


async def test_every_event_is_named_numbered_and_tagged(stack: Stack) -> None:
    content = script(
        {"reasoning": "need weather"},
        {"text": "Checking 巴黎"},
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris 巴黎"}}},
    )
    # stream: false is ignored: this endpoint always streams.
    response = await post_events(stack, chat(content, tools=TOOLS, stream=False))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-gateway-events-version"] == "1"
    request_id = response.headers["x-request-id"]
    events = parse_events(response.content)
    types = [e["type"] for e in events]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert all(e["v"] == 1 and e["request_id"] == request_id for e in events)
    assert all("id" not in e for e in events)  # the client's own id exists on the WebSocket only
    assert events[0] == {
        "v": 1,
        "type": "response.started",
        "request_id": request_id,
        "seq": 0,
        "alias": "agent-lite",
        "provider": "sim-a",
    }
    assert "".join(e["text"] for e in events if e["type"] == "reasoning.delta") == "need weather"
    text = "".join(e["text"] for e in events if e["type"] == "text.delta")
    assert text.strip() == "Checking 巴黎"
    fragments = [e for e in events if e["type"] == "tool_call.delta"]
    assert fragments[0]["call_id"] and fragments[0]["name"] == "get_weather"
    assert json.loads("".join(f["arguments_delta"] for f in fragments)) == {"city": "Paris 巴黎"}
    [done] = [e for e in events if e["type"] == "tool_call.done"]
    assert done["call_id"] == fragments[0]["call_id"]
    assert done["arguments"] == {"city": "Paris 巴黎"}
    assert done["arguments_valid"] is True
    # Usage is always reported, then the one terminal event.
    assert types[-2:] == ["usage", "response.done"]
    assert events[-2]["completion_tokens"] == stack.sim.engine.stats().tokens_generated
    assert events[-2]["reasoning_tokens"] == 2
    assert events[-1]["finish_reason"] == "tool_calls"
    assert (
        types.index("reasoning.delta") < types.index("text.delta") < types.index("tool_call.done")
    )


async def test_invalid_tool_arguments_arrive_raw_and_flagged(stack: Stack) -> None:
    content = script({"tool_call": {"name": "get_weather", "arguments": '{"city": "Par'}})
    response = await post_events(stack, chat(content, tools=TOOLS))
    [done] = [e for e in parse_events(response.content) if e["type"] == "tool_call.done"]
    assert done["arguments"] == '{"city": "Par'
    assert done["arguments_valid"] is False


async def test_errors_before_the_first_event_are_http_errors(stack: Stack) -> None:
    unknown = await post_events(stack, {**chat("hi"), "model": "no-such-alias"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert unknown.headers["x-request-id"]
    async with httpx.AsyncClient() as client:
        not_json = await client.post(stack.v1 + "/events", content=b"{nope")
        wrong_method = await client.get(stack.v1 + "/events")
    assert not_json.status_code == 400
    assert not_json.json()["error"]["code"] == "invalid_json"
    assert wrong_method.status_code == 405
    upstream_down = await post_events(stack, chat(script({"status": 503})))
    assert upstream_down.status_code == 502
    assert upstream_down.json()["error"]["code"] == "upstream_error"


async def test_an_error_mid_stream_is_the_last_event(stack: Stack) -> None:
    response = await post_events(stack, chat(script({"text": "one two three"}, {"drop": True})))
    assert response.status_code == 200
    events = parse_events(response.content)
    assert [e["type"] for e in events][:2] == ["response.started", "text.delta"]
    assert events[-1]["type"] == "error"
    assert events[-1]["code"] == "upstream_protocol_error"
    assert events[-1]["retryable"] is True
    assert events[-1]["provider"] == "sim-a"
    assert events[-1]["seq"] == len(events) - 1
    assert not [e for e in events if e["type"] == "response.done"]


async def test_a_client_leaving_the_event_stream_aborts_the_upstream(stack: Stack) -> None:
    async with (
        httpx.AsyncClient() as client,
        client.stream("POST", stack.v1 + "/events", json=chat(LONG)) as response,
    ):
        assert response.status_code == 200
        seen = 0
        async for line in response.aiter_lines():
            if line.startswith("event: text.delta"):
                seen += 1
            if seen == 5:
                break
    await wait_for_abort(stack.sim)
    stats = stack.sim.engine.stats()
    assert stats.tokens_generated < 1000
    assert stats.tokens_generated_after_client_left <= 2
    upstream = stack.gateway.router.upstreams["sim-a"]
    await wait_until(lambda: upstream.statistics().in_flight == 0, timeout_s=2)
