"""Budget holds and settlement against cloud vendors end to end: a hold covers all the output
the request sent to the vendor may produce, and a request is settled at the prices it was
admitted with, whatever a reload did meanwhile."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx

from tests.e2e.harness import FAST_SIM, chat, running_gateway, running_sim, script
from tests.e2e.test_cloud_providers import KEYS
from tests.e2e.test_limits import write_keys
from trio_gateway.config.load import parse_config
from trio_gateway.core.usage import estimate_prompt_tokens
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.sim import SimHandle

PER_TOKEN = 1e-3  # both prices below, per token
PRICES = "price_input_per_mtok = 1000.0\nprice_output_per_mtok = 1000.0\n"
HELD_OPEN = script({"text": "a"}, {"delay_s": 60}, {"text": "b"})


def gemini_toml(sim: SimHandle, model: str, *, extra: str = "") -> str:
    return f"""
[[aliases.agent-lite.providers]]
name = "gemini"
type = "gemini"
base_url = "{sim.base_url}"
model = "{model}"
api_key_env = "KEY"
probe = false
queue_timeout_s = 30.0
{PRICES}{extra}
"""


@asynccontextmanager
async def keyed_gateway(keys_file: Path, providers: str) -> AsyncIterator[GatewayHandle]:
    text = (
        f'[server]\nlisten = "127.0.0.1:0"\n[auth]\nkeys_file = "{keys_file}"\n'
        f'[usage]\nledger = "none"\n[aliases.agent-lite]\n{providers}'
    )
    config = parse_config(text, source="test.toml", environ={"KEY": KEYS["gemini"]})
    async with running_gateway(config) as handle:
        yield handle


def hold_of(body: dict[str, object], output_tokens: int) -> float:
    return (estimate_prompt_tokens(body["messages"]) + output_tokens) * PER_TOKEN


async def test_a_hold_covers_what_the_vendor_may_produce_without_a_limit(tmp_path: Path) -> None:
    """A request without max_tokens lets Gemini write up to the model's output cap (8192 for
    gemini-2.0-flash), so that is what its hold counts; it used to count default_max_tokens
    (4096), and two such requests ran on a budget that covers one."""
    keys_file, key = write_keys(tmp_path, "budget = 10.0")
    sim_config = attrs.evolve(
        FAST_SIM, dialect="gemini", served_model_name="gemini-2.0-flash", api_key=KEYS["gemini"]
    )
    headers = {"authorization": f"Bearer {key}"}
    async with (
        running_sim(sim_config) as sim,
        keyed_gateway(keys_file, gemini_toml(sim, "gemini-2.0-flash")) as gw,
        httpx.AsyncClient(timeout=10, headers=headers) as client,
    ):
        url = gw.base_url + "/v1/chat/completions"
        first = chat(HELD_OPEN, stream=True)
        async with client.stream("POST", url, json=first) as held:
            assert held.status_code == 200
            async for _ in held.aiter_bytes():
                break
            second = chat("another")
            refused = await client.post(url, json=second)
            # With a limit, the limit is what Gemini may produce: it fits beside the first.
            small = await client.post(url, json=chat("another", max_tokens=100))
        assert refused.status_code == 402, refused.text
        message = refused.json()["error"]["message"]
        assert f"has {10.0 - hold_of(first, 8192):.6f} of its budget left" in message
        assert f"may cost up to {hold_of(second, 8192):.6f}" in message
        assert small.status_code == 200, small.text
