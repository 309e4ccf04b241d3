"""Budget holds and settlement against cloud vendors end to end: a hold covers all the output
the request sent to the vendor may produce, and a request is settled at the prices it was
admitted with, whatever a reload did meanwhile."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from tests.e2e.harness import (
    FAST_SIM,
    chat,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from tests.e2e.test_cloud_providers import KEYS
from tests.e2e.test_limits import write_keys
from tests.e2e.test_usage_ledger import PAUSE_AFTER_K, K
from trio_gateway.accounting.limit_store import MemoryStore
from trio_gateway.config.load import load_config, parse_config
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


@pytest.mark.parametrize("change", ["prices", "removed"])
async def test_a_reload_mid_stream_settles_at_the_prices_it_was_admitted_with(
    tmp_path: Path, change: str
) -> None:
    """A reload that changes the provider's prices (x10), or removes it, while a stream runs
    on it: the request is settled at the prices it was admitted with. (It was settled at the
    new prices, or at nothing for a removed provider, looked up in the new router.) The client
    leaves after K chunks, so it is billed exactly the prompt and the K tokens vLLM made."""
    keys_file, key = write_keys(tmp_path, "budget = 1000.0")
    path = tmp_path / "gateway.toml"
    head = f'[server]\nlisten = "127.0.0.1:0"\n[auth]\nkeys_file = "{keys_file}"\n'
    head += '[usage]\nledger = "none"\n[aliases.agent-lite]\n'
    async with running_sim() as blue, running_sim() as green:
        path.write_text(head + provider_toml("blue", blue.base_url, extra=PRICES))
        after = {
            "prices": provider_toml("blue", blue.base_url, extra=PRICES.replace("1000.0", "1e4")),
            "removed": provider_toml("green", green.base_url, extra=PRICES),
        }[change]
        load = partial(load_config, path, environ={"SIM_KEY": "sim-key"})
        async with (
            running_gateway(load(), load=load) as gw,
            httpx.AsyncClient(timeout=10, headers={"authorization": f"Bearer {key}"}) as client,
        ):
            body = chat(PAUSE_AFTER_K, stream=True, max_tokens=1000)
            async with client.stream("POST", gw.base_url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                seen = 0
                async for line in r.aiter_lines():
                    if '"content":' in line and '"content":""' not in line:
                        seen += 1
                        if seen == 1:
                            path.write_text(head + after)
                            assert await gw.reload()
                            assert list(gw.router.upstreams) == [
                                "blue" if change == "prices" else "green"
                            ]
                    if seen == K:
                        break
            with trio.fail_after(10):
                stats = await blue.engine.wait_until(lambda s: s.aborts == 1 and not s.running)
            store = gw.router.limits.store
            assert isinstance(store, MemoryStore)
            await wait_until(lambda: store.held("alice") == 0)
            spent = store.spent("alice")
    assert seen == K and stats.tokens_generated == K
    # 1e-3 per token = 1e6 nanos per token, input and output alike, as admitted.
    assert spent == (stats.prompt_tokens + K) * 1_000_000
