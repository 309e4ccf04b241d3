"""Real servers for end-to-end tests: the simulator and the gateway on free ports, in-process."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.process.serve import GatewayHandle, serve_gateway
from trio_gateway.sim import SimConfig, SimHandle, serve_sim

# A fast fake GPU: tests wait on events, but tokens still take real time to arrive.
FAST_SIM = SimConfig(
    served_model_name="qwen3-32b",
    max_num_seqs=8,
    max_model_len=4096,
    api_key="sim-key",
    decode_step_s=0.002,
    decode_step_s_per_seq=0.0001,
    prefill_s_per_token=0.00001,
)


def provider_toml(
    name: str,
    base_url: str,
    *,
    alias: str = "agent-lite",
    weight: int = 100,
    max_inflight: int = 8,
    capabilities: str = '["tools", "reasoning", "json_schema"]',
    api_key_env: str | None = "SIM_KEY",
    probe: bool = False,
    extra: str = "",
) -> str:
    """One provider entry. Probes are off unless asked for: they would add generations to
    the simulator's counters that a test does not expect."""
    key = f'api_key_env = "{api_key_env}"\n' if api_key_env else ""
    return f"""
[[aliases.{alias}.providers]]
name = "{name}"
type = "openai_compatible"
base_url = "{base_url}/v1"
model = "qwen3-32b"
{key}max_inflight = {max_inflight}
capabilities = {capabilities}
weight = {weight}
probe = {str(probe).lower()}
{extra}
"""


def gateway_config(providers: str, server: str = "") -> GatewayConfig:
    text = f'[server]\nlisten = "127.0.0.1:0"\n{server}\n[aliases.agent-lite]\n{providers}'
    return parse_config(text, source="test.toml", environ={"SIM_KEY": "sim-key"})


@asynccontextmanager
async def running_sim(config: SimConfig = FAST_SIM) -> AsyncIterator[SimHandle]:
    async with trio.open_nursery() as nursery:
        handle: SimHandle = await nursery.start(serve_sim, config)
        yield handle
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def running_gateway(
    config: GatewayConfig,
    *,
    kernel_stall_drop: bool = True,
    load: Callable[[], GatewayConfig] | None = None,
) -> AsyncIterator[GatewayHandle]:
    async with trio.open_nursery() as nursery:
        handle: GatewayHandle = await nursery.start(
            lambda task_status: serve_gateway(
                config,
                rng=random.Random(0),
                kernel_stall_drop=kernel_stall_drop,
                load=load,
                task_status=task_status,
            )
        )
        yield handle
        nursery.cancel_scope.cancel()


@attrs.frozen
class Stack:
    sim: SimHandle
    gateway: GatewayHandle

    @property
    def v1(self) -> str:
        return self.gateway.base_url + "/v1"

    async def sim_stats(self) -> dict[str, Any]:
        """The simulator's counters, and the request bodies it recorded (``?bodies=1``)."""
        async with httpx.AsyncClient() as client:
            response = await client.get(self.sim.base_url + "/sim/stats?bodies=1")
            stats: dict[str, Any] = response.json()
            return stats


def chat(content: str = "hello", **fields: Any) -> dict[str, Any]:
    return {"model": "agent-lite", "messages": [{"role": "user", "content": content}], **fields}


def script(*steps: dict[str, Any]) -> str:
    import json

    return "<sim>" + json.dumps({"steps": list(steps)}, ensure_ascii=False) + "</sim>"


def answer_text(body: str, *, stream: bool) -> str:
    """The assistant's text from a whole response or an SSE stream of chunks."""
    import json

    if not stream:
        content: str = json.loads(body)["choices"][0]["message"]["content"] or ""
        return content
    parts = []
    for line in body.split("\n"):
        if line.startswith("data: {"):
            choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
            parts.append(choices[0].get("delta", {}).get("content") or "")
    return "".join(parts)


async def wait_until(predicate: Callable[[], bool], *, timeout_s: float = 5.0) -> None:
    """Wait for state another server owns and announces no event for (simulator stats, gate
    counts). Polled, under a hard deadline so a broken behaviour fails instead of hanging."""
    with trio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 - there is no event to wait on
            await trio.sleep(0.01)
