"""Operability end to end: one access line per request on every front, request ids and traces
that join the client, the gateway and the upstream, and metrics that count refusals too."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
import trio_websocket

from tests.e2e.harness import Stack, chat
from trio_gateway.core.events_codec import TERMINAL_TYPES

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SECRET_PROMPT = "the secret word is pumpernickel"


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [dict(r.__dict__["access"]) for r in caplog.records if r.name == "trio_gateway.access"]


async def test_request_id_and_trace_join_the_client_and_the_upstream(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=20) as client:
        response = await client.post(
            stack.v1 + "/chat/completions",
            json=chat(),
            headers={
                "x-request-id": "client-req-42",
                "traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01",
                "tracestate": "congo=t61rcWkgMzE",
            },
        )
        assert response.status_code == 200
        assert response.headers["x-request-id"] == "client-req-42"
        assert response.json()["id"] == "chatcmpl-client-req-42"
        # An id that could forge a log line is replaced, and the new one is echoed.
        forged = await client.post(
            stack.v1 + "/chat/completions", json=chat(), headers={"x-request-id": "a\tb"}
        )
        assert forged.headers["x-request-id"] not in ("a\tb", "")
        # Every answer carries it, not only chat ones.
        assert "x-request-id" in (await client.get(stack.v1 + "/models")).headers
    first, second = stack.sim.engine.stats().last_request_headers[:2]
    assert first["x-request-id"] == "client-req-42"
    version, trace, span, flags = first["traceparent"].split("-")
    assert (version, trace, flags) == ("00", TRACE, "01")
    assert span != CLIENT_SPAN  # the upstream call is the gateway's own span
    assert first["tracestate"] == "congo=t61rcWkgMzE"
    # No traceparent from the client: the gateway starts a trace of its own.
    assert second["traceparent"].split("-")[1] != TRACE
    assert "tracestate" not in second


async def test_one_access_line_per_request_on_every_front(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "trio_gateway.access")
    async with httpx.AsyncClient(timeout=20) as client:
        ok = await client.post(
            stack.v1 + "/chat/completions",
            json=chat(SECRET_PROMPT, stream=True, stream_options={"include_usage": True}),
            headers={"x-request-id": "streamed-1"},
        )
        assert ok.status_code == 200
        bad_json = await client.post(
            stack.v1 + "/chat/completions",
            content=b"{nope",
            headers={"content-type": "application/json", "x-request-id": "bad-json-1"},
        )
        assert bad_json.status_code == 400
        missing = await client.get(stack.gateway.base_url + "/nowhere")
        assert missing.status_code == 404
        events = await client.post(stack.v1 + "/events", json=chat())
        assert events.status_code == 200
        await client.get(stack.gateway.base_url + "/healthz")  # debug only
    url = stack.gateway.base_url.replace("http://", "ws://") + "/v1/ws"
    async with trio_websocket.open_websocket_url(url) as ws:
        await ws.send_message(json.dumps({"type": "request", "id": "w1", "body": chat()}))
        while json.loads(await ws.get_message())["type"] not in TERMINAL_TYPES:
            pass
    lines = access_lines(caplog)
    by_route: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_route.setdefault(line["route"], []).append(line)
    assert sorted(by_route) == [
        "GET /nowhere",
        "POST /v1/chat/completions",
        "POST /v1/events",
        "WS /v1/ws",
    ]
    streamed, refused = by_route["POST /v1/chat/completions"]
    assert streamed["request_id"] == "streamed-1"
    assert (streamed["status"], streamed["outcome"], streamed["code"]) == (200, "completed", None)
    assert (streamed["alias"], streamed["provider"]) == ("agent-lite", "sim-a")
    assert streamed["prompt_tokens"] > 0 and streamed["completion_tokens"] > 0
    assert streamed["ttft_ms"] is not None and streamed["duration_ms"] >= streamed["ttft_ms"]
    assert refused["request_id"] == "bad-json-1"
    assert (refused["status"], refused["outcome"], refused["code"]) == (
        400,
        "refused",
        "invalid_json",
    )
    (not_found,) = by_route["GET /nowhere"]
    assert not_found["status"] == 404
    (ws_line,) = by_route["WS /v1/ws"]
    assert (ws_line["status"], ws_line["outcome"], ws_line["alias"]) == (
        None,
        "completed",
        "agent-lite",
    )
    (events_line,) = by_route["POST /v1/events"]
    assert events_line["outcome"] == "completed"
    # Never a prompt or a completion in a log line.
    assert all(SECRET_PROMPT not in r.getMessage() for r in caplog.records)


async def test_refusals_before_routing_are_counted_with_bounded_labels(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=20) as client:
        for alias in ("no-such-alias-1", "no-such-alias-2"):
            unknown = await client.post(
                stack.v1 + "/chat/completions", json={**chat(), "model": alias}
            )
            assert unknown.status_code == 404
        await client.post(
            stack.v1 + "/chat/completions",
            content=b"{",
            headers={"content-type": "application/json"},
        )
        await client.get(stack.gateway.base_url + "/x/" + "y" * 50)
        metrics = (await client.get(stack.gateway.base_url + "/metrics")).text
    assert (
        'gateway_requests_total{alias="",code="model_not_found",outcome="refused",provider=""} 2.0'
        in metrics
    )
    assert (
        'gateway_requests_total{alias="",code="invalid_json",outcome="refused",provider=""} 1.0'
        in metrics
    )
    assert 'gateway_http_requests_total{route="other",status="404"} 1.0' in metrics
    assert 'gateway_http_requests_total{route="/v1/chat/completions",status="404"} 2.0' in metrics
    assert "no-such-alias" not in metrics
    assert "yyyy" not in metrics
