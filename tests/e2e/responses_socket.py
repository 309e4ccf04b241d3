"""Helpers for the Responses WebSocket's end-to-end tests: every event the gateway sends read
through the openai SDK's strict types, and the gateway's own counts of what its sockets did."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pydantic
from openai import AsyncOpenAI, OpenAI
from openai.resources.responses.responses import AsyncResponsesConnection, ResponsesConnection
from openai.types.responses.responses_server_event import ResponsesServerEvent

from tests.e2e.harness import script
from trio_gateway.process.serve import GatewayHandle

T = TypeVar("T")
SERVER_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponsesServerEvent)
DONE = ("response.completed", "response.incomplete", "response.failed", "error")
TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def strict(data: str | bytes) -> Any:
    """One server message as the SDK's types read it, strictly: a field of the wrong type, a
    missing one or an unknown event type fails the test (the SDK itself reads leniently)."""
    return SERVER_EVENT.validate_python(json.loads(data), strict=True)


def tool_step(step: int, *, last: bool) -> str:
    """What the simulator answers at a step: a call, or (the last) text."""
    if last:
        return script({"text": f"done after {step} calls"})
    return script(
        {"reasoning": f"step {step}"},
        {"tool_call": {"name": "get_weather", "arguments": {"city": f"city{step}"}}},
    )


def read_until_done(connection: ResponsesConnection, stream_id: str | None = None) -> list[Any]:
    """Events (strictly read) up to the end of the next answer (on ``stream_id``'s lane)."""
    events = []
    while True:
        event = strict(connection.recv_bytes())
        events.append(event)
        if event.type in DONE and (stream_id is None or event.stream_id == stream_id):
            return events


async def arecv(connection: AsyncResponsesConnection) -> Any:
    """The next event, strictly read."""
    return strict(await connection.recv_bytes())


async def aread_until_done(
    connection: AsyncResponsesConnection, stream_id: str | None = None
) -> list[Any]:
    events = []
    while True:
        event = strict(await connection.recv_bytes())
        events.append(event)
        if event.type in DONE and (stream_id is None or event.stream_id == stream_id):
            return events


def sync_client(v1: str) -> OpenAI:
    return OpenAI(base_url=v1, api_key="unused", max_retries=0)


def async_client(v1: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=v1, api_key="unused", max_retries=0)


def in_asyncio(make: Callable[[], Coroutine[Any, Any, T]]) -> Callable[[], T]:
    """The async SDK's WebSocket runs on asyncio (``websockets``): in a thread of its own."""

    def run() -> T:
        return asyncio.run(make())

    return run


def metric(gateway: GatewayHandle, name: str, **labels: str) -> float:
    value = gateway.router.metrics.registry.get_sample_value(name, labels)
    return float(value or 0.0)


def socket_creates(gateway: GatewayHandle, outcome: str) -> float:
    return metric(gateway, "gateway_responses_socket_creates_total", outcome=outcome)


def http_posts(gateway: GatewayHandle) -> float:
    """``POST /v1/responses`` over HTTP, whatever their status: none, when the socket carried
    every turn."""
    samples = gateway.router.metrics.registry.collect()
    return sum(
        sample.value
        for family in samples
        if family.name == "gateway_http_requests"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("route") == "/v1/responses"
    )
