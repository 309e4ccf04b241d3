"""Conformance: the same requests to real vLLM 0.32 and to our simulator, the wires compared.

Both servers are configured alike (served name `qwen3-32b`, `max_model_len` 2048,
`max_num_seqs` 4, an API key) and asked directly, not through the gateway. Real vLLM is steered
with `structured_outputs.regex` (the tiny model writes exactly the regex), the simulator with a
`<sim>` script that produces the same shape. What is compared is the *shape*
(tests/vllm/wire_shape.py): status, media type, the order of chunk kinds, key paths and value
types per kind, and the values that are part of the dialect (`object`, `finish_reason`, error
`type`/`param`/`message`...). Text and token counts are not: the model is noise.

A difference is either fixed in the simulator or listed in KNOWN_DIFFERENCES with its reason.
A listed difference that no longer shows up fails the test too, so the table stays true.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import trio

from tests.vllm.helpers import TOOL_CALL_RE, WEATHER_TOOL
from tests.vllm.vllm_server import VllmServer
from tests.vllm.wire_shape import Transcript, differences, signature
from trio_gateway.sim import SimConfig, SimHandle, serve_sim

pytestmark = pytest.mark.vllm

Json = dict[str, Any]
MODEL = "qwen3-32b"
PROMPT = "what is the weather in paris"
NO_THINK: Json = {"chat_template_kwargs": {"enable_thinking": False}}
TOOLS: Json = {"tools": [WEATHER_TOOL], "tool_choice": "auto"}
TOOL_CALL_STEP: Json = {"tool_call": {"name": "get_weather", "arguments": {"city": "x"}}}
# Qwen3 writes a blank line after </think>; the simulator always does.
REASONING_RE = "<think>abc</think>\n\nhello"
# Over 2048 tokens for both tokenizers (the simulator's: one per word; the tiny model's: more).
TOO_LONG = "hello world weather " * 800


@dataclass(frozen=True)
class Request:
    method: str = "POST"
    path: str = "/v1/chat/completions"
    body: Json | None = None
    auth: str = "key"  # "key" | "none" | "wrong"


@dataclass(frozen=True)
class Case:
    name: str
    vllm: Request
    sim: Request
    # Extra checks on both transcripts, beyond "same shape": (what, predicate).
    checks: tuple[tuple[str, Callable[[Transcript], bool]], ...] = field(default=())


def chat(content: str = PROMPT, **fields: Any) -> Json:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


def sim_script(*steps: Json) -> str:
    return f"{PROMPT} <sim>{json.dumps({'steps': list(steps)})}</sim>"


def same(name: str, body: Json | None = None, **request: Any) -> Case:
    """A case whose request is the same for both servers."""
    r = Request(body=body, **request)
    return Case(name, r, r)


def forced(name: str, regex: str, steps: list[Json], **fields: Any) -> Case:
    """vLLM forced by a regex, the simulator by a script of the same shape."""
    return Case(
        name,
        Request(body=chat(structured_outputs={"regex": regex}, temperature=0, **fields)),
        Request(body=chat(sim_script(*steps), **fields)),
    )


STREAM_USAGE: Json = {"stream": True, "stream_options": {"include_usage": True}}
CASES: list[Case] = [
    # Unforced: the tiny model runs to max_tokens; the simulator's default answer is longer.
    same("stream_include_usage", chat(max_tokens=8, temperature=0, **STREAM_USAGE, **NO_THINK)),
    same("stream_no_stream_options", chat(max_tokens=8, temperature=0, stream=True, **NO_THINK)),
    same(
        "stream_include_usage_false",
        chat(
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": False},
            **NO_THINK,
        ),
    ),
    same(
        "stream_continuous_usage",
        chat(
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            **NO_THINK,
        ),
    ),
    same("stream_thinking_default", chat(max_tokens=8, temperature=0, **STREAM_USAGE)),
    same("nonstream_thinking_default", chat(max_tokens=8, temperature=0)),
    same("nonstream_thinking_off", chat(max_tokens=8, temperature=0, **NO_THINK)),
    same(
        "nonstream_ignored_fields",
        chat(max_tokens=4, temperature=0, user="u-1", store=True, metadata={"k": "v"}, **NO_THINK),
    ),
    # Forced shapes.
    forced(
        "stream_reasoning",
        REASONING_RE,
        [{"reasoning": "abc"}, {"text": "hello"}],
        max_tokens=60,
        **STREAM_USAGE,
    ),
    forced("nonstream_reasoning", REASONING_RE, [{"reasoning": "abc"}, {"text": "hello"}]),
    forced(
        "stream_tool_call",
        TOOL_CALL_RE,
        [TOOL_CALL_STEP],
        max_tokens=60,
        **STREAM_USAGE,
        **TOOLS,
        **NO_THINK,
    ),
    forced(
        "nonstream_tool_call", TOOL_CALL_RE, [TOOL_CALL_STEP], max_tokens=60, **TOOLS, **NO_THINK
    ),
    forced(
        "stream_reasoning_then_tool_call",
        "<think>abc</think>\n\n" + TOOL_CALL_RE,
        [{"reasoning": "abc"}, TOOL_CALL_STEP],
        max_tokens=80,
        **STREAM_USAGE,
        **TOOLS,
    ),
    forced(
        "nonstream_reasoning_then_tool_call",
        "<think>abc</think>\n\n" + TOOL_CALL_RE,
        [{"reasoning": "abc"}, TOOL_CALL_STEP],
        max_tokens=80,
        **TOOLS,
    ),
    # Limits.
    same("context_length", chat(TOO_LONG, max_tokens=10)),
    same("context_length_stream", chat(TOO_LONG, max_tokens=10, stream=True)),
    same("max_tokens_over_max_model_len", chat(max_tokens=3000)),
    Case(
        # prompt + max_tokens over the limit: not refused, the output is cut at 2048 in total.
        "prompt_plus_max_tokens_clamped",
        Request(body=chat("hello world weather " * 250, max_tokens=200, **NO_THINK)),
        Request(
            body=chat(
                "hello world weather " * 660 + sim_script({"text_tokens": 200}),
                max_tokens=200,
                **NO_THINK,
            )
        ),
        checks=(("cut at max_model_len", lambda t: t.body["usage"]["total_tokens"] == 2048),),
    ),
    # Request errors.
    same("unknown_model", {**chat(max_tokens=1), "model": "other-model"}),
    same(
        "stream_options_without_stream", chat(max_tokens=1, stream_options={"include_usage": True})
    ),
    same("messages_missing", {"model": MODEL, "max_tokens": 1}),
    same("invalid_json_type_max_tokens", chat(max_tokens="many")),
    # Auth and the small endpoints.
    same("no_key", chat(max_tokens=1), auth="none"),
    same("wrong_key", chat(max_tokens=1), auth="wrong"),
    same("models_no_key", method="GET", path="/v1/models", auth="none"),
    same("models", method="GET", path="/v1/models"),
    same("load", method="GET", path="/load", auth="none"),
    same("health", method="GET", path="/health", auth="none"),
    same("unknown_path", method="GET", path="/v1/nothing-here"),
    same("wrong_method", method="GET", path="/v1/chat/completions"),
]


def _known(reason: str, *prefixes: str) -> dict[str, str]:
    return dict.fromkeys(prefixes, reason)


_PYDANTIC_400 = (
    "vLLM 0.32 reports a request that fails validation with type 'Bad Request', "
    "param 'body.<field>' and '1 validation error:\\n  {...}'; the simulator's "
    "validation_error (sim/errors.py) writes an older vLLM's list form, type "
    "BadRequestError, param null. Through the gateway, only the message and param of the "
    "client's invalid_request error differ."
)
# case -> {start of a difference line (as wire_shape.differences words it): why it is accepted}.
# Every entry must match a difference that still shows up (stale entries fail the test).
KNOWN_DIFFERENCES: dict[str, dict[str, str]] = {
    "stream_options_without_stream": _known(
        "vLLM checks this in its request model and words it as a plain 400 with "
        "param 'stream_options'; the simulator (sim/request.py) answers with a pydantic-style "
        "list and param null.",
        "body: only reference: $.error.message: str = Stream options can only be defined",
        "body: only reference: $.error.param: str = stream_options",
        "body: only candidate: $.error.message: str = [{'type': 'value_error'",
        "body: only candidate: $.error.param: null",
    ),
    "messages_missing": _known(
        _PYDANTIC_400,
        "body: only reference: $.error.message: str = 1 validation error:",
        "body: only reference: $.error.param: str = body.messages",
        "body: only reference: $.error.type: str = Bad Request",
        "body: only candidate: $.error.message: str = [{'type': 'missing'",
        "body: only candidate: $.error.param: null",
        "body: only candidate: $.error.type: str = BadRequestError",
    ),
    "invalid_json_type_max_tokens": _known(
        _PYDANTIC_400,
        "body: only reference: $.error.message: str = 1 validation error:",
        "body: only reference: $.error.param: str = body.max_tokens",
        "body: only reference: $.error.type: str = Bad Request",
        "body: only candidate: $.error.message: str = [{'type': 'int_type'",
        "body: only candidate: $.error.param: null",
        "body: only candidate: $.error.type: str = BadRequestError",
    ),
}


@pytest.fixture
async def sim(vllm_server: VllmServer) -> AsyncIterator[SimHandle]:
    config = SimConfig(
        served_model_name=vllm_server.served_model_name,
        max_model_len=vllm_server.max_model_len,
        max_num_seqs=4,
        api_key=vllm_server.api_key,
        enable_prompt_tokens_details=True,  # as tools/vllm/serve.py starts vLLM
    )
    async with trio.open_nursery() as nursery:
        handle: SimHandle = await nursery.start(serve_sim, config)
        yield handle
        nursery.cancel_scope.cancel()


async def exchange(root_url: str, api_key: str, request: Request) -> Transcript:
    headers = {
        "key": {"Authorization": f"Bearer {api_key}"},
        "none": {},
        "wrong": {"Authorization": "Bearer wrong"},
    }[request.auth]
    body = request.body if request.method == "POST" else None
    async with (
        httpx.AsyncClient(base_url=root_url, headers=headers, timeout=60.0) as client,
        client.stream(request.method, request.path, json=body) as response,
    ):
        text = (await response.aread()).decode("utf-8", "replace")
    return Transcript.from_http(response.status_code, response.headers.get("content-type"), text)


def explain(case: str, found: list[str]) -> tuple[list[str], list[str]]:
    """(differences nobody explained, explanations whose difference did not show up)."""
    known: Mapping[str, str] = KNOWN_DIFFERENCES.get(case, {})
    unexplained = [d for d in found if not any(d.startswith(k) for k in known)]
    stale = [k for k in known if not any(d.startswith(k) for d in found)]
    return unexplained, stale


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_same_wire_as_vllm(case: Case, vllm_server: VllmServer, sim: SimHandle) -> None:
    real = await exchange(vllm_server.root_url, vllm_server.api_key, case.vllm)
    ours = await exchange(sim.base_url, vllm_server.api_key, case.sim)
    found = differences(signature(real), signature(ours))
    unexplained, stale = explain(case.name, found)
    report = "\n".join(
        [f"vLLM: {real.text[:1500]}", f"sim:  {ours.text[:1500]}"]
        + [f"UNEXPLAINED {d}" for d in unexplained]
        + [f"STALE (no longer differs) {d}" for d in stale]
    )
    assert not unexplained and not stale, report
    for what, check in case.checks:
        assert check(real) and check(ours), what


_TYPE_LINE = re.compile(r"^# TYPE (?P<name>\S+) (?P<kind>\S+)$", re.M)
_SAMPLE_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)\{(?P<labels>[^}]*)\} \S+$", re.M)


def metric_families(text: str) -> dict[str, tuple[str, frozenset[frozenset[str]]]]:
    """name -> (type, the label-name sets of its samples), from Prometheus text."""
    labels: dict[str, set[frozenset[str]]] = {}
    for m in _SAMPLE_LINE.finditer(text):
        keys = frozenset(pair.split("=", 1)[0] for pair in m["labels"].split(",") if pair)
        labels.setdefault(m["name"], set()).add(keys)
    return {
        m["name"]: (m["kind"], frozenset(labels.get(m["name"], ())))
        for m in _TYPE_LINE.finditer(text)
    }


async def test_metrics_the_simulator_offers_are_vllms(
    vllm_server: VllmServer, sim: SimHandle
) -> None:
    """Every family the simulator exposes exists in real vLLM, same type and label names."""
    async with httpx.AsyncClient(timeout=30.0) as client:
        real = metric_families((await client.get(vllm_server.root_url + "/metrics")).text)
        ours = metric_families((await client.get(sim.base_url + "/metrics")).text)
    assert len(ours) >= 9
    for name, (kind, label_sets) in ours.items():
        assert name in real, name
        assert real[name][0] == kind, (name, real[name][0], kind)
        assert label_sets <= real[name][1], (name, real[name][1], label_sets)
