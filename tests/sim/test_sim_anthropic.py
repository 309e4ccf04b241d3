"""The `anthropic` dialect: pure request checks and stream grammar, then the anthropic SDK
(sync client in a worker thread) against a real simulator on a free port."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import attrs
import httpx
import pytest
import trio

from trio_gateway.sim import SimConfig
from trio_gateway.sim.anthropic_request import thinking_signature
from trio_gateway.sim.anthropic_wire import (
    AnthropicContext,
    AnthropicStream,
    parse_messages_request,
)
from trio_gateway.sim.errors import ApiError
from trio_gateway.sim.script import plan_generation

from .conftest import StartSim

MODEL = "claude-sim"
KEY = "sk-ant-test"
VERSION = b"2023-06-01"
TOOLS: Any = [
    {
        "name": "get_weather",
        "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
# A raw argument string whose \u00e9 escape the 3-character fragments must cut through.
ESCAPED_ARGS = '{"city": "Par\\u00e9s \\"quoted\\"", "n": 12345}'
DEADLINE_S = 10


def scripted(*steps: Any) -> str:
    return f"go <sim>{json.dumps({'steps': list(steps)})}</sim>"


def body(**fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 2048,
        "messages": [{"role": "user", "content": "hello"}],
        **fields,
    }


CONFIG = SimConfig(dialect="anthropic", served_model_name=MODEL, max_model_len=4096)
THINKING = {"type": "enabled", "budget_tokens": 1024}
SIGNED_HM = thinking_signature("hm")  # the simulated model's own signature


# ---- pure: request checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_body", "status", "message"),
    [
        (body(n=2), 400, "n: Extra inputs are not permitted"),
        (body(stream_options={}), 400, "stream_options: Extra inputs are not permitted"),
        ({"model": MODEL, "messages": []}, 400, "max_tokens: Field required"),
        (body(messages=[]), 400, "at least one message"),
        (
            body(messages=[{"role": "assistant", "content": "hi"}]),
            400,
            'first message must use the "user" role',
        ),
        (
            body(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
            400,
            "roles must alternate",
        ),
        (body(messages=[{"role": "system", "content": "a"}]), 400, "messages.0.role"),
        (
            body(messages=[{"role": "user", "content": [{"type": "text", "text": ""}]}]),
            400,
            "text content blocks must be non-empty",
        ),
        (
            body(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/bmp", "data": ""},
                            }
                        ],
                    }
                ]
            ),
            400,
            "media_type",
        ),
        (
            body(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}],
                    }
                ]
            ),
            400,
            "unexpected `tool_use_id`",
        ),
        (
            body(
                messages=[
                    {"role": "user", "content": "a"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
                        ],
                    },
                    {"role": "user", "content": "no result"},
                ]
            ),
            400,
            "without `tool_result` blocks",
        ),
        (body(thinking={"type": "enabled", "budget_tokens": 1000}), 400, "greater than or equal"),
        (body(max_tokens=1024, thinking=THINKING), 400, "must be greater than"),
        (body(thinking=THINKING, temperature=0.5), 400, "`temperature` may only be set to 1"),
        (
            body(thinking=THINKING, tools=TOOLS, tool_choice={"type": "any"}),
            400,
            "forces tool use",
        ),
        (body(tool_choice={"type": "sometimes"}), 400, "tool_choice"),
        (
            body(stop_sequences=["END", "\n"]),
            400,
            "stop_sequences: each stop sequence must contain non-whitespace",
        ),
        (body(stop_sequences=[""]), 400, "stop_sequences: each stop sequence must be non-empty"),
        (
            body(tools=[{"name": "f", "input_schema": {"type": "object"}, "strict": 1}]),
            400,
            "strict",
        ),
        (body(model="gpt-4o"), 404, "model: gpt-4o"),
        (body(max_tokens=5000), 400, "maximum allowed number of output tokens"),
        (
            body(messages=[{"role": "user", "content": "word " * 5000}]),
            400,
            "prompt is too long: 5010 tokens > 4096 maximum",
        ),
    ],
)
def test_bad_requests_are_refused(request_body: Any, status: int, message: str) -> None:
    error = parse_messages_request(json.dumps(request_body).encode(), CONFIG, version=VERSION)
    assert isinstance(error, ApiError), error
    assert error.status == status
    assert error.body["type"] == "error"
    assert error.body["error"]["type"] == (
        "not_found_error" if status == 404 else "invalid_request_error"
    )
    assert message in error.body["error"]["message"]


def test_max_tokens_over_the_models_output_cap_is_refused() -> None:
    """Claude models write far less than their context holds: the cap is its own limit."""
    capped = attrs.evolve(CONFIG, max_output_tokens=1000)
    error = parse_messages_request(json.dumps(body()).encode(), capped, version=VERSION)
    assert isinstance(error, ApiError)
    assert error.body["error"]["message"] == (
        f"max_tokens: 2048 > 1000, which is the maximum allowed number of output tokens for {MODEL}"
    )
    fits = body(max_tokens=1000)
    assert not isinstance(
        parse_messages_request(json.dumps(fits).encode(), capped, version=VERSION), ApiError
    )


def test_version_header_is_required() -> None:
    error = parse_messages_request(json.dumps(body()).encode(), CONFIG, version=None)
    assert isinstance(error, ApiError)
    assert error.body["error"]["message"] == "anthropic-version: header is required"


def test_good_requests_are_accepted() -> None:
    good = [
        body(system="be brief"),
        body(system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]),
        body(thinking=THINKING, temperature=1),
        body(thinking={"type": "disabled"}, temperature=0.2),
        body(tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}),
        body(tools=TOOLS, tool_choice={"type": "auto", "disable_parallel_tool_use": True}),
        body(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this"},
                        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": SIGNED_HM},
                        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}],
                },
            ]
        ),
    ]
    for request_body in good:
        parsed = parse_messages_request(json.dumps(request_body).encode(), CONFIG, version=VERSION)
        assert not isinstance(parsed, ApiError), (request_body, parsed)


def test_tool_results_replay_the_question_script_like_tool_messages() -> None:
    question = scripted({"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}})
    messages = [
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
    ]
    raw = json.dumps(body(messages=messages, tools=TOOLS)).encode()
    parsed = parse_messages_request(raw, CONFIG, version=VERSION)
    assert not isinstance(parsed, ApiError)
    assert [m["role"] for m in parsed.chat.messages] == ["user", "assistant", "tool"]
    assert plan_generation(parsed.chat, CONFIG).tool_calls == 1


# ---- pure: the stream grammar --------------------------------------------------------------


def _events(raw: list[bytes]) -> list[tuple[str, Any]]:
    out = []
    for event in b"".join(raw).decode().split("\n\n"):
        if event:
            name, data = event.split("\n")
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_stream_grammar_and_fragments_cut_inside_escapes() -> None:
    steps = (
        {"reasoning": "hmm"},
        {"text": "Hi"},
        {"tool_call": {"name": "get_weather", "arguments": ESCAPED_ARGS}},
    )
    raw = json.dumps(
        body(
            thinking=THINKING,
            tools=TOOLS,
            messages=[{"role": "user", "content": scripted(*steps)}],
        )
    ).encode()
    parsed = parse_messages_request(raw, CONFIG, version=VERSION)
    assert not isinstance(parsed, ApiError)
    generation = plan_generation(parsed.chat, CONFIG)
    ctx = AnthropicContext(
        message_id="msg_1", model=MODEL, prompt_tokens=30, tool_ids=("toolu_1",), thinking=True
    )
    renderer = AnthropicStream(ctx, generation)
    events = _events([e for i in range(len(generation.tokens)) for e in renderer.token(i, 16)])
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]["usage"]
    assert start["input_tokens"] == 14 and start["cache_read_input_tokens"] == 16
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    kinds = [d["type"] for d in deltas]
    assert kinds.index("signature_delta") == kinds.index("text_delta") - 1
    assert {name for name, _ in events} >= {"content_block_start", "content_block_stop"}
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    pieces = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
    assert "".join(pieces) == ESCAPED_ARGS
    # Some fragment ends inside the \u00e9 escape and another inside a \" escape.
    assert any(p.endswith(("\\", "\\u", "\\u0", "\\u00", "\\u00e")) for p in pieces)
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "tool_use"
    assert final["usage"]["output_tokens"] == len(generation.tokens)


# ---- the SDK against a real simulator ------------------------------------------------------


def sdk(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=KEY, max_retries=0, timeout=10)


async def in_thread(fn: Any, *args: Any) -> Any:
    return await trio.to_thread.run_sync(fn, *args)


async def start(start_sim: StartSim, **fields: Any) -> Any:
    fields = {"dialect": "anthropic", "served_model_name": MODEL, "api_key": KEY, **fields}
    return await start_sim(**fields)


async def test_sdk_reads_a_scripted_vendor_stop_reason(start_sim: StartSim) -> None:
    sim = await start(start_sim)
    refused: Any = [
        {"role": "user", "content": scripted({"text": "I"}, {"vendor_finish": "refusal"})}
    ]

    def run() -> Any:
        client = sdk(sim.base_url)
        with client.messages.stream(model=MODEL, max_tokens=64, messages=refused) as stream:
            streamed = stream.get_final_message()
        whole = client.messages.create(model=MODEL, max_tokens=64, messages=refused)
        return streamed, whole

    streamed, whole = await in_thread(run)
    assert streamed.stop_reason == whole.stop_reason == "refusal"


async def test_sdk_streams_thinking_text_and_tool_calls(start_sim: StartSim) -> None:
    sim = await start(start_sim)
    steps = (
        {"reasoning": "let me think"},
        {"text": "Hello 世界 🌍"},
        {"tool_call": {"name": "get_weather", "arguments": ESCAPED_ARGS}},
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
    )

    def run() -> Any:
        with sdk(sim.base_url).messages.stream(
            model=MODEL,
            max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
            tools=TOOLS,
            messages=[{"role": "user", "content": scripted(*steps)}],
        ) as stream:
            types = [event.type for event in stream]
            return types, stream.get_final_message()

    types, message = await in_thread(run)
    assert "thinking" in types and "text" in types and "input_json" in types
    blocks = message.content
    assert [b.type for b in blocks] == ["thinking", "text", "tool_use", "tool_use"]
    assert blocks[0].thinking == "let me think" and blocks[0].signature
    assert blocks[1].text == "Hello 世界 🌍"
    assert blocks[2].input == {"city": 'Parés "quoted"', "n": 12345}
    assert blocks[3].input == {"city": "Oslo"}
    assert blocks[2].id.startswith("toolu_01")
    assert message.stop_reason == "tool_use"
    assert message.usage.output_tokens > 0 and message.usage.input_tokens > 0


async def test_sdk_whole_message_without_thinking(start_sim: StartSim) -> None:
    sim = await start(start_sim)

    def run() -> Any:
        return sdk(sim.base_url).messages.create(
            model=MODEL,
            max_tokens=200,
            system="be brief",
            messages=[{"role": "user", "content": scripted({"reasoning": "x"}, {"text": "Hi"})}],
        )

    message = await in_thread(run)
    # Thinking is not enabled: the script's reasoning is not generated at all.
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hi"
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 2  # "Hi" and the end of turn
    cut = await in_thread(
        lambda: sdk(sim.base_url).messages.create(
            model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hello"}]
        )
    )
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3


async def test_repeated_prompts_report_cache_reads(start_sim: StartSim) -> None:
    sim = await start(start_sim)
    long = "a long shared prefix " * 20

    def run() -> Any:
        return (
            sdk(sim.base_url)
            .messages.create(
                model=MODEL, max_tokens=5, messages=[{"role": "user", "content": long}]
            )
            .usage
        )

    first, second = await in_thread(run), await in_thread(run)
    assert first.cache_read_input_tokens == 0
    assert second.cache_read_input_tokens and second.cache_read_input_tokens > 0
    total = second.input_tokens + second.cache_read_input_tokens
    assert total == first.input_tokens


@pytest.mark.parametrize(
    ("step", "error_class", "status", "error_type"),
    [
        ({"status": 429, "retry_after": 7}, anthropic.RateLimitError, 429, "rate_limit_error"),
        ({"status": 529}, anthropic.OverloadedError, 529, "overloaded_error"),
        ({"status": 500}, anthropic.InternalServerError, 500, "api_error"),
    ],
)
async def test_sdk_raises_scripted_errors(
    start_sim: StartSim, step: Any, error_class: type[Exception], status: int, error_type: str
) -> None:
    sim = await start(start_sim)

    def run() -> None:
        sdk(sim.base_url).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": scripted(step)}]
        )

    with pytest.raises(error_class) as info:
        await in_thread(run)
    error = info.value
    assert isinstance(error, anthropic.APIStatusError)
    assert error.status_code == status
    answer: Any = error.body
    assert answer["error"]["type"] == error_type
    assert answer["request_id"].startswith("req_")
    if status in (429, 529):
        assert error.response.headers["retry-after"] == str(step.get("retry_after", 1))


async def test_sdk_errors_for_auth_and_context(start_sim: StartSim) -> None:
    sim = await start(start_sim, max_model_len=256)

    def wrong_key() -> None:
        client = anthropic.Anthropic(base_url=sim.base_url, api_key="nope", max_retries=0)
        client.messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}]
        )

    with pytest.raises(anthropic.AuthenticationError):
        await in_thread(wrong_key)

    def too_long() -> None:
        sdk(sim.base_url).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "w " * 300}]
        )

    with pytest.raises(anthropic.BadRequestError) as info:
        await in_thread(too_long)
    assert "prompt is too long: 310 tokens > 256 maximum" in str(info.value)


async def test_sdk_raises_on_an_error_event_mid_stream(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start(start_sim)
    content = scripted({"text": "one two"}, {"status": 529, "in_stream": True}, {"text": "never"})
    seen: list[str] = []

    def run() -> None:
        with sdk(sim.base_url).messages.stream(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": content}]
        ) as stream:
            seen.extend(stream.text_stream)

    with pytest.raises(anthropic.APIStatusError) as info:
        await in_thread(run)
    event: Any = info.value.body
    assert event["error"]["type"] == "overloaded_error"
    assert "".join(seen) == "one two"
    # On the wire: an `error` event ends the body, and no message_stop came before it.
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    raw = body(max_tokens=100, stream=True, messages=[{"role": "user", "content": content}])
    r = await client.post(sim.base_url + "/v1/messages", json=raw, headers=headers)
    assert r.status_code == 200
    events = [line for line in r.text.split("\n") if line.startswith("event: ")]
    assert events[-1] == "event: error" and "event: message_stop" not in events
    with trio.fail_after(DEADLINE_S):
        await sim.engine.wait_until(lambda s: s.aborts == 2 and s.running == 0)


async def test_x_api_key_and_bearer_both_work(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start(start_sim)
    url = sim.base_url + "/v1/messages"
    raw = body(max_tokens=5)
    for auth in ({"x-api-key": KEY}, {"authorization": f"Bearer {KEY}"}):
        r = await client.post(url, json=raw, headers={"anthropic-version": "2023-06-01", **auth})
        assert r.status_code == 200, r.text
        assert r.json()["type"] == "message"
    r = await client.post(url, json=raw, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 401
    assert r.json()["error"] == {"type": "authentication_error", "message": "invalid x-api-key"}


async def test_client_leaving_mid_stream_aborts(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start(start_sim)
    content = scripted({"text": "first"}, {"delay_s": 60}, {"text": "never"})
    raw = body(stream=True, messages=[{"role": "user", "content": content}])
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    with trio.fail_after(DEADLINE_S):
        async with client.stream(
            "POST", sim.base_url + "/v1/messages", json=raw, headers=headers
        ) as r:
            async for line in r.aiter_lines():
                if "text_delta" in line:
                    break
        stats = await sim.engine.wait_until(lambda s: s.aborts == 1 and s.running == 0)
    assert stats.disconnects == 1
