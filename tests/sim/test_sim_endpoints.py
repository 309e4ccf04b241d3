"""The simulator's /v1/completions and /v1/embeddings over real sockets: vLLM 0.32.0's wire
(key order as a real vLLM wrote it in the real-vLLM tier), its refusals, its runners; and the
openai dialect's differences."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import httpx

from trio_gateway.sim.text import split_text

from .conftest import StartSim
from .helpers import sse_payloads

# As real vLLM 0.32.0 wrote them (tiny Qwen3, --enable-prompt-tokens-details off here).
WHOLE_KEYS = [
    "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
    "usage", "kv_transfer_params", "ec_transfer_params", "metrics",
]  # fmt: skip
WHOLE_CHOICE_KEYS = [
    "index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
    "prompt_logprobs", "prompt_token_ids", "routed_experts",
]  # fmt: skip
CHUNK_CHOICE_KEYS = [
    "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids",
]  # fmt: skip
EMBEDDINGS_KEYS = ["id", "object", "created", "model", "data", "usage"]


def script(*steps: Any) -> str:
    return f"go <sim>{json.dumps({'steps': list(steps)})}</sim>"


async def stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        text = (await r.aread()).decode()
    return [p if p == "[DONE]" else json.loads(p) for p in sse_payloads(text)]


async def test_a_whole_completion_in_vllms_shape(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim()
    prompt = script({"text": "Hello 世界"})
    r = await client.post(sim.base_url + "/v1/completions", json={"prompt": prompt})
    body = r.json()
    assert list(body) == WHOLE_KEYS and body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    [choice] = body["choices"]
    assert list(choice) == WHOLE_CHOICE_KEYS
    assert (choice["text"], choice["finish_reason"]) == ("Hello 世界", "stop")
    # No template around a completion's prompt: its tokens alone.
    assert body["usage"]["prompt_tokens"] == len(split_text(prompt))
    assert body["usage"]["completion_tokens"] == 4  # Hello, " 世", 界, EOS
    assert list(body["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    ]


async def test_without_max_tokens_a_completion_stops_at_16(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim()
    r = await client.post(sim.base_url + "/v1/completions", json={"prompt": "hello"})
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 16
    assert body["usage"]["prompt_tokens"] == 1


async def test_a_stream_has_a_chunk_per_token_and_usage_when_asked(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim()
    body = {
        "prompt": script({"text": "a b c"}),
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events = await stream(client, sim.base_url, body)
    assert events[-1] == "[DONE]"
    *chunks, closing = events[:-1]
    assert [list(c["choices"][0]) for c in chunks] == [CHUNK_CHOICE_KEYS] * 4
    assert [c["choices"][0]["text"] for c in chunks] == ["a", " b", " c", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "stop"]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4]
    assert closing["choices"] == [] and closing["usage"]["completion_tokens"] == 4
    plain = await stream(client, sim.base_url, {**body, "stream_options": None})
    assert all("usage" not in c for c in plain[:-1])
    assert plain[-2]["choices"][0]["finish_reason"] == "stop"


async def test_each_prompt_and_each_n_is_a_choice(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim()
    r = await client.post(
        sim.base_url + "/v1/completions",
        json={"prompt": [script({"text": "x"}), [1, 2, 3]], "n": 2, "max_tokens": 4},
    )
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["text"] for c in choices[:2]] == ["x", "x"]
    events = await stream(
        client, sim.base_url, {"prompt": ["a", "b"], "max_tokens": 2, "stream": True}
    )
    finished = [c["choices"][0]["index"] for c in events[:-1] if c["choices"][0]["finish_reason"]]
    assert finished == [0, 1]
    stats = sim.engine.stats()
    assert stats.requests == 2 and stats.running == 0


async def test_completions_are_refused_in_vllms_words(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim(max_model_len=64)
    empty = "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"
    cases: list[tuple[dict[str, Any], int, str, str | None]] = [
        ({}, 400, empty, "prompt"),
        ({"prompt": ""}, 400, empty, "prompt"),
        ({"prompt": []}, 400, "You must pass at least one prompt", None),
        (
            {"prompt": "x", "stream_options": {"include_usage": True}},
            400,
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "stream_options",
        ),
        ({"prompt": "x", "model": "nope"}, 404, "The model `nope` does not exist.", "model"),
        ({"prompt": "x", "max_tokens": 100}, 400, "max_tokens=100 cannot be", "max_tokens"),
        ({"prompt": "w " * 70}, 400, "maximum context length is 64 tokens", "input_tokens"),
    ]
    for body, status, message, param in cases:
        r = await client.post(sim.base_url + "/v1/completions", json=body)
        error = r.json()["error"]
        assert (r.status_code, error["param"], error["code"]) == (status, param, status), body
        assert error["message"].startswith(message) or message in error["message"], error


async def test_each_runner_has_its_own_routes(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    generate, pooling = await start_sim(), await start_sim(runner="pooling")
    r = await client.post(generate.base_url + "/v1/embeddings", json={"input": "x"})
    assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = await client.post(pooling.base_url + path, json={"prompt": "x"})
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})


async def test_embeddings_in_vllms_shape_as_floats_or_base64(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim(runner="pooling", embedding_dimensions=8)
    url = sim.base_url + "/v1/embeddings"
    floats = (await client.post(url, json={"input": ["hello world", "hi"]})).json()
    assert list(floats) == EMBEDDINGS_KEYS and floats["object"] == "list"
    assert [list(d) for d in floats["data"]] == [["index", "object", "embedding"]] * 2
    first = floats["data"][0]["embedding"]
    assert len(first) == 8 and math.isclose(math.fsum(v * v for v in first), 1.0, abs_tol=1e-6)
    assert floats["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 3,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    packed = (
        await client.post(url, json={"input": "hello world", "encoding_format": "base64"})
    ).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert list(struct.unpack("<8f", raw)) == first  # the same input, the same vector
    ids = (await client.post(url, json={"input": [[1, 2], [3]]})).json()
    assert ids["usage"]["prompt_tokens"] == 3


async def test_embeddings_are_refused_in_vllms_words(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim(runner="pooling")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": ""}, "The decoder prompt cannot be empty"),
        ({"input": []}, "You must pass at least one prompt"),
        ({"input": "x", "dimensions": 4}, "does not support Matryoshka embeddings"),
        ({}, "'missing'"),
        ({"input": "x", "encoding_format": "hex"}, "'literal_error'"),
    ]
    for body, message in cases:
        r = await client.post(sim.base_url + "/v1/embeddings", json=body)
        assert r.status_code == 400 and message in r.json()["error"]["message"], (body, r.text)


async def test_the_openai_dialect_serves_both_and_refuses_unknown_fields(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start_sim(dialect="openai")
    r = await client.post(sim.base_url + "/v1/completions", json={"prompt": "x", "top_k": 3})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "Unrecognized request argument supplied: top_k",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    whole = (await client.post(sim.base_url + "/v1/completions", json={"prompt": "x"})).json()
    assert "stop_reason" not in whole["choices"][0] and "kv_transfer_params" not in whole
    short = (
        await client.post(sim.base_url + "/v1/embeddings", json={"input": "x", "dimensions": 4})
    ).json()
    assert len(short["data"][0]["embedding"]) == 4
    missing = await client.post(sim.base_url + "/v1/embeddings", json={"model": "x", "input": "a"})
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "model_not_found")
