"""Shared by the real-vLLM tests: reading Prometheus text, waiting on vLLM's load signals,
an in-process gateway whose one provider is the real vLLM, and requests to it."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from tests.e2e.harness import provider_toml, running_gateway
from tests.vllm.vllm_server import VllmServer
from tests.vllm.wire_shape import Transcript
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.process.serve import GatewayHandle

ALIAS = "agent-lite"
PROVIDER = "vllm"
# The gateway reads the provider's key from this variable of the environ given to parse_config.
KEY_ENV = "TRIO_GATEWAY_TEST_VLLM_KEY"

_METRIC_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")

# The one tool the dialect tests call, and the regex that makes the tiny model call it (the
# tags are written as Qwen3's added tokens: see docs/testing.md).
WEATHER_TOOL: Any = {  # Any: the openai SDK wants its own TypedDicts
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_CALL_RE = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "x"\}\}\n</tool_call>'


def prom_value(text: str, name: str, **labels: str) -> float | None:
    """Sum of the samples of `name` whose labels include `labels`; None if there are none."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total, seen = 0.0, False
    for line in text.splitlines():
        m = _METRIC_LINE.match(line)
        if m and m["name"] == name and all(w in (m["labels"] or "") for w in want):
            total += float(m["value"])
            seen = True
    return total if seen else None


async def metric(root: httpx.AsyncClient, name: str, **labels: str) -> float:
    """Sum of a metric's samples for our model (and `labels`) in vLLM's /metrics."""
    resp = await root.get("/metrics")
    assert resp.status_code == 200
    value = prom_value(resp.text, name, model_name="qwen3-32b", **labels)
    assert value is not None, f"{name} not in /metrics"
    return value


async def wait_metric(
    root: httpx.AsyncClient, name: str, value: float, within: float, **labels: str
) -> None:
    """Poll /metrics until `name` equals `value` (fails after `within` seconds)."""
    with trio.fail_after(within):
        while await metric(root, name, **labels) != value:  # noqa: ASYNC110 - vLLM has no events
            await trio.sleep(0.1)


async def wait_load(root: httpx.AsyncClient, value: int, within: float) -> None:
    """Poll /load until it reports `value` in-flight requests."""
    with trio.fail_after(within):
        while (await root.get("/load")).json()["server_load"] != value:  # noqa: ASYNC110
            await trio.sleep(0.1)


async def wait_generation_settled(root: httpx.AsyncClient, within: float) -> float:
    """Wait until nothing runs, then return vLLM's generated-token counter."""
    await wait_metric(root, "vllm:num_requests_running", 0, within=within)
    return await metric(root, "vllm:generation_tokens_total")


def gateway_config(
    server: VllmServer,
    *,
    max_inflight: int = 4,
    probe: bool = False,
    extra: str = "",
) -> GatewayConfig:
    """The gateway in front of the real vLLM: alias `agent-lite`, one provider `vllm` with
    tools, reasoning and json_schema, the server's real key. Probes are off unless asked for:
    they add generations to vLLM's counters that a test does not expect."""
    provider = provider_toml(
        PROVIDER,
        server.root_url,
        alias=ALIAS,
        max_inflight=max_inflight,
        api_key_env=KEY_ENV,
        probe=probe,
        extra=extra,
    )
    text = f'[server]\nlisten = "127.0.0.1:0"\n\n[aliases.{ALIAS}]\n{provider}'
    return parse_config(text, source="vllm-tier.toml", environ={KEY_ENV: server.api_key})


@asynccontextmanager
async def vllm_gateway(
    server: VllmServer, *, max_inflight: int = 4, probe: bool = False, extra: str = ""
) -> AsyncIterator[GatewayHandle]:
    config = gateway_config(server, max_inflight=max_inflight, probe=probe, extra=extra)
    async with running_gateway(config) as gateway:
        yield gateway


# --- requests to that gateway (test_gateway_vllm.py, test_gateway_vllm_engine.py) --------------

Json = dict[str, Any]
PROMPT = "what is the weather in paris"


def messages(content: str = PROMPT) -> Any:
    return [{"role": "user", "content": content}]


def chat(content: str = PROMPT, **fields: Any) -> Json:
    return {"model": ALIAS, "messages": messages(content), **fields}


async def post(client: httpx.AsyncClient, body: Json) -> Transcript:
    """POST /v1/chat/completions and capture the whole answer (stream or not)."""
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        text = (await resp.aread()).decode()
    return Transcript.from_http(resp.status_code, resp.headers.get("content-type"), text)


def chunks_of(transcript: Transcript) -> list[Json]:
    assert transcript.status == 200, transcript.text
    assert transcript.events is not None and transcript.events[-1] == "[DONE]"
    return [e for e in transcript.events if isinstance(e, dict)]
