"""A gateway in front of two simulated replicas under the `affinity` policy, as
deploy/kubernetes/base/gateway.toml puts one in front of vLLM's replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tests.e2e.harness import gateway_config, running_gateway, running_sim
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.sim.config import SimConfig
from trio_gateway.sim.server import SimHandle


def replicas_toml(*sims: SimHandle, probe: bool) -> str:
    endpoints = ", ".join(f'"{s.base_url}/v1"' for s in sims)
    probing = (
        "probe = true\nprobe_interval_s = 0.05\nscrape_interval_s = 0.05\nstartup_grace_s = 0"
        if probe
        else "probe = false"
    )
    return f"""
[[aliases.agent-lite.providers]]
name = "fleet"
type = "openai_compatible"
endpoints = [{endpoints}]
routing = "affinity"
model = "qwen3-32b"
api_key_env = "SIM_KEY"
max_inflight = 4
queue_timeout_s = 5
capabilities = ["tools", "reasoning", "json_schema"]
{probing}
"""


@asynccontextmanager
async def fleet(
    sim: SimConfig, *, probe: bool
) -> AsyncIterator[tuple[GatewayHandle, SimHandle, SimHandle]]:
    async with running_sim(sim) as a, running_sim(sim) as b:
        config = gateway_config(replicas_toml(a, b, probe=probe))
        async with running_gateway(config) as gateway:
            yield gateway, a, b
