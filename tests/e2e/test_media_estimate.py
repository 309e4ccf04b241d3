"""A vision request is counted by its image's tokens, not by its base64: admitted under a
key's `tpm`, and billed as the vendor counts it when its stream is cut before the vendor said.
Before, a 1 MB image counted some 340,000 tokens: a 429 against a 100,000 `tpm`, and a cut
stream billed at ~100x the vendor's price."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from tests.e2e.harness import FAST_SIM, running_gateway, script, wait_until
from tests.e2e.test_usage_ledger import PAUSE_AFTER_K, K, ledger_rows, read_k_content_chunks
from trio_gateway.config.load import parse_config
from trio_gateway.core.keys import hash_key, new_key
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.sim import SimHandle, serve_sim

TIMEOUT_S = 20
SIM_KEY = "sk-media-0123456789abcdef"
# A PNG header saying 2000 x 1500, padded to a megabyte: OpenAI counts it as 765 tokens
# (fit in 2048, short side to 768: 1024 x 768, 2 x 2 tiles of 512: 85 + 4 x 170).
IMAGE_TOKENS = 765
PNG = (
    b"\x89PNG\r\n\x1a\n"
    + struct.pack(">I", 13)
    + b"IHDR"
    + struct.pack(">II", 2000, 1500)
    + b"\x08\x02\x00\x00\x00"
    + b"\0" * 1_000_000
)
IMAGE = {
    "type": "image_url",
    "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
}


def vision_chat(text: str, **fields: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": text}, IMAGE]
    return {"model": "agent-lite", "messages": [{"role": "user", "content": content}], **fields}


@asynccontextmanager
async def vision_gateway(tmp_path: Path, limits: str) -> AsyncIterator[tuple[GatewayHandle, str]]:
    """An OpenAI simulator serving gpt-4o behind a gateway whose one key has ``limits``."""
    key = new_key()
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(f'[keys.alice]\nsha256 = "{hash_key(key)}"\n{limits}\n')
    async with trio.open_nursery() as nursery:
        config = attrs.evolve(
            FAST_SIM, dialect="openai", api_key=SIM_KEY, served_model_name="gpt-4o"
        )
        sim: SimHandle = await nursery.start(serve_sim, config)
        text = f"""
[server]
listen = "127.0.0.1:0"
[auth]
keys_file = "{keys_file}"
[usage]
ledger = "{tmp_path / "usage.sqlite3"}"
flush_interval_s = 0.05
[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "gpt"
type = "openai"
base_url = "{sim.base_url}/v1"
model = "gpt-4o"
api_key_env = "KEY"
capabilities = ["vision"]
probe = false
"""
        gateway_config = parse_config(text, source="test.toml", environ={"KEY": SIM_KEY})
        async with running_gateway(gateway_config) as gateway:
            yield gateway, key
        nursery.cancel_scope.cancel()


async def test_a_vision_request_takes_its_images_tokens_of_the_keys_tpm(tmp_path: Path) -> None:
    async with (
        vision_gateway(tmp_path, "tpm = 100000") as (gateway, key),
        httpx.AsyncClient(timeout=TIMEOUT_S, headers={"authorization": f"Bearer {key}"}) as client,
    ):
        answer = await client.post(
            gateway.base_url + "/v1/chat/completions",
            json=vision_chat("what is this? " + script({"text": "a cat"}), max_tokens=10),
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "a cat"
    taken = 100_000 - int(answer.headers["x-ratelimit-remaining-tokens"])
    # The image, max_tokens and the few tokens of the text around it.
    assert IMAGE_TOKENS + 10 < taken < IMAGE_TOKENS + 10 + 100, taken


async def test_a_cut_vision_stream_bills_the_image_as_the_vendor_counts_it(tmp_path: Path) -> None:
    async with (
        vision_gateway(tmp_path, "budget = 1000.0") as (gateway, key),
        httpx.AsyncClient(timeout=TIMEOUT_S, headers={"authorization": f"Bearer {key}"}) as client,
    ):
        _, seen = await read_k_content_chunks(
            client,
            gateway.base_url + "/v1/chat/completions",
            vision_chat(PAUSE_AFTER_K, stream=True),
        )
        ledger = tmp_path / "usage.sqlite3"
        await wait_until(lambda: ledger.exists() and len(ledger_rows(ledger)) == 1)
    assert seen == K
    [row] = ledger_rows(ledger)
    # OpenAI sends its counts only at the end: the stream was cut before, so the prompt is the
    # gateway's estimate, made for the provider that answered.
    assert (row["outcome"], row["estimated"], row["completion_tokens"]) == ("cancelled", 1, K)
    assert IMAGE_TOKENS < row["prompt_tokens"] < IMAGE_TOKENS + 100, row["prompt_tokens"]
