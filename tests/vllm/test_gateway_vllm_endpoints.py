"""/v1/completions and /v1/embeddings through the gateway in front of a real vLLM 0.32 (CPU,
tiny random Qwen3), the openai SDK as the client: the session's generating vLLM serves
completions; a second vLLM serves the same model as an embedding model (`--runner pooling
--convert embed`) for embeddings. What vLLM itself reports is the reference for every count.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from tests.e2e.harness import provider_toml, running_gateway
from tests.vllm.helpers import ALIAS, KEY_ENV, metric, vllm_gateway, wait_metric
from tests.vllm.vllm_server import VllmServer
from trio_gateway.config.load import parse_config
from trio_gateway.process.serve import GatewayHandle

pytestmark = pytest.mark.vllm

PROMPT = "The weather in Paris is"
# The tiny model's weights are random: ignore_eos makes the length of an answer known.
EXACT: Any = {"ignore_eos": True}


def sdk(gateway: GatewayHandle) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0)


async def direct(server: VllmServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=60.0) as client:
        response = await client.post(
            f"{server.root_url}/v1{path}",
            json={"model": server.served_model_name, **body},
            headers={"authorization": f"Bearer {server.api_key}"},
        )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_a_completion_whole_and_streamed(
    gateway: GatewayHandle, vllm_server: VllmServer
) -> None:
    client = sdk(gateway)
    reference = await direct(vllm_server, "/completions", {"prompt": PROMPT, "max_tokens": 5})
    whole = await client.completions.create(
        model=ALIAS, prompt=PROMPT, max_tokens=5, extra_body=EXACT
    )
    assert whole.model == ALIAS and whole.object == "text_completion"
    [choice] = whole.choices
    assert choice.finish_reason == "length" and choice.text
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (
        reference["usage"]["prompt_tokens"],
        5,
    )
    stream = await client.completions.create(
        model=ALIAS,
        prompt=PROMPT,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=EXACT,
    )
    pieces, finish, usage = [], None, None
    async for chunk in stream:
        assert chunk.object == "text_completion" and chunk.model == ALIAS
        usage = chunk.usage or usage
        for c in chunk.choices:
            pieces.append(c.text)
            finish = c.finish_reason or finish
    assert finish == "length" and len(pieces) >= 2 and "".join(pieces)
    assert usage is not None and usage.completion_tokens == 8
    await client.close()


async def test_several_prompts_and_token_ids(gateway: GatewayHandle) -> None:
    client = sdk(gateway)
    for prompt in ([PROMPT, "Bonjour"], [[1, 2, 3], [4, 5]]):
        completion = await client.completions.create(
            model=ALIAS, prompt=prompt, max_tokens=3, extra_body=EXACT
        )
        assert [(c.index, c.finish_reason) for c in completion.choices] == [
            (0, "length"),
            (1, "length"),
        ]
        assert completion.usage is not None and completion.usage.completion_tokens == 6
    await client.close()


async def test_a_chat_model_asked_for_embeddings_is_unsupported_endpoint(
    gateway: GatewayHandle,
) -> None:
    client = sdk(gateway)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.embeddings.create(model=ALIAS, input="hello")
    assert refused.value.code == "unsupported_endpoint"
    await client.close()


async def test_a_client_leaving_a_streamed_completion_makes_vllm_abort(
    vllm_server: VllmServer,
) -> None:
    async with (
        vllm_gateway(vllm_server) as gateway,
        httpx.AsyncClient(base_url=vllm_server.root_url, timeout=30.0) as root,
    ):
        await wait_metric(root, "vllm:num_requests_running", 0, within=30)
        client = sdk(gateway)
        stream = await client.completions.create(
            model=ALIAS, prompt=PROMPT, max_tokens=2000, stream=True, extra_body=EXACT
        )
        received = 0
        async for _ in stream:
            received += 1
            if received == 10:
                break
        assert await metric(root, "vllm:num_requests_running") == 1
        await stream.close()
        await wait_metric(root, "vllm:num_requests_running", 0, within=10)
        assert gateway.router.upstreams["vllm"].statistics().in_flight == 0
        await client.close()


@pytest.fixture
async def embed_gateway(vllm_embedder: VllmServer) -> AsyncIterator[GatewayHandle]:
    provider = provider_toml(
        "vllm-embed", vllm_embedder.root_url, alias="embed", api_key_env=KEY_ENV, capabilities="[]"
    )
    text = f'[server]\nlisten = "127.0.0.1:0"\n\n[aliases.embed]\n{provider}'
    config = parse_config(text, source="embed.toml", environ={KEY_ENV: vllm_embedder.api_key})
    async with running_gateway(config) as gateway:
        yield gateway


async def test_embeddings_from_a_pooling_vllm(
    embed_gateway: GatewayHandle, vllm_embedder: VllmServer
) -> None:
    reference = await direct(vllm_embedder, "/embeddings", {"input": ["hello world", "bonjour"]})
    client = sdk(embed_gateway)
    floats = await client.embeddings.create(
        model="embed", input=["hello world", "bonjour"], encoding_format="float"
    )
    packed = await client.embeddings.create(model="embed", input=["hello world", "bonjour"])
    assert floats.model == "embed"
    assert [d.embedding for d in floats.data] == [d["embedding"] for d in reference["data"]]
    for ours, theirs in zip(packed.data, floats.data, strict=True):
        assert ours.embedding == pytest.approx(theirs.embedding, abs=1e-6)  # float32 on the wire
    vector = floats.data[0].embedding
    assert len(vector) == 128 and math.isclose(math.fsum(v * v for v in vector), 1.0, abs_tol=1e-4)
    assert floats.usage.prompt_tokens == reference["usage"]["prompt_tokens"]
    with pytest.raises(openai.BadRequestError) as completion:
        await client.completions.create(model="embed", prompt="x")
    assert completion.value.code == "unsupported_endpoint"
    await client.close()
