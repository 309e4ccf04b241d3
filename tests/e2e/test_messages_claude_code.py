"""What Claude Code sends to ``/v1/messages``, served as is: its path (``?beta=true``), headers
(seven ``anthropic-beta`` flags, ``anthropic-version``, ``x-app: cli``), adaptive thinking with
``output_config.effort``, ``context_management``, system blocks with ``cache_control``, twelve
tools, ``max_tokens: 32000`` and a JSON ``metadata.user_id`` (shape from Claude Code 2.1.x as
captured in issue 32 and public request logs); its second, smaller request of a turn; and
``count_tokens``. Then the front as the others: cancellation, access log, metrics."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from tests.e2e.harness import (
    Stack,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from tests.e2e.test_access_log import access_lines
from tests.e2e.test_cancellation import LONG, cancellations, wait_for_abort
from tests.e2e.test_cloud_providers import Fleet
from tests.e2e.test_thinking_tool_loop import vendor_fleet

SESSION = "5c1f0f4e-9a55-4d7e-8a8e-0f6f3c1c2b7a"
BETAS = (
    "claude-code-20250219",
    "interleaved-thinking-2025-05-14",
    "context-management-2025-06-27",
    "fine-grained-tool-streaming-2025-05-14",
    "effort-2025-11-24",
    "prompt-caching-scope-2026-01-05",
    "advanced-tool-use-2025-11-20",
)
HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": ",".join(BETAS),
    "anthropic-dangerous-direct-browser-access": "true",
    "x-app": "cli",
    "user-agent": "claude-cli/2.1.328 (external, cli)",
    "x-stainless-lang": "js",
    "x-stainless-helper-method": "stream",
    "x-stainless-retry-count": "0",
    "x-api-key": "unused",
}
TOOL_NAMES = (
    "Task",
    "Bash",
    "Glob",
    "Grep",
    "ExitPlanMode",
    "Read",
    "Edit",
    "Write",
    "NotebookEdit",
    "WebFetch",
    "TodoWrite",
    "WebSearch",
)


def tool(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"{name} tool.",
        "input_schema": {
            "type": "object",
            "properties": {"arg": {"type": "string", "description": "what to act on"}},
            "required": ["arg"],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    }


def main_turn(prompt: str) -> dict[str, Any]:
    """The turn's main request, as Claude Code 2.1.x sends it."""
    tools = [tool(name) for name in TOOL_NAMES]
    tools[-1]["cache_control"] = {"type": "ephemeral"}
    user_id = {"device_id": "d" * 64, "account_uuid": "", "session_id": SESSION}
    return {
        "model": "agent-lite",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>Be careful.</system-reminder>"},
                    {"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}},
                ],
            },
            # 2.1.328 sends its environment as a system message after the user's.
            {"role": "system", "content": [{"type": "text", "text": "# Environment\nlinux"}]},
        ],
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328;"},
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "Help with software tasks.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "tools": tools,
        "metadata": {"user_id": json.dumps(user_id)},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        # A field a later release adds: dropped, never a refusal.
        "speculative_decoding_hint_2027": {"mode": "auto"},
        "stream": True,
    }


def small_turn(prompt: str) -> dict[str, Any]:
    """The second request of a turn (a title, a topic): small model, no tools, temperature."""
    return {
        "model": "agent-lite",
        "max_tokens": 512,
        "messages": [{"role": "user", "content": prompt}],
        "system": [{"type": "text", "text": "Summarize in under 50 characters."}],
        "temperature": 0,
        "metadata": {"user_id": json.dumps({"session_id": SESSION})},
        "stream": True,
    }


def sse_events(raw: str) -> list[dict[str, Any]]:
    """Each SSE event's data, checked to be named by its ``event:`` line as Anthropic does."""
    out = []
    for frame in raw.split("\n\n"):
        if not frame.strip():
            continue
        lines = frame.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        data = json.loads(lines[1][len("data: ") :])
        assert data["type"] == lines[0][len("event: ") :]
        out.append(data)
    return out


def check_grammar(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic's stream grammar, exactly; the content blocks, folded."""
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "ping"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    blocks: list[dict[str, Any]] = []
    open_index: int | None = None
    for event in events[2:-2]:
        if event["type"] == "content_block_start":
            assert open_index is None and event["index"] == len(blocks)
            open_index = event["index"]
            blocks.append(dict(event["content_block"]))
        elif event["type"] == "content_block_delta":
            assert event["index"] == open_index
            delta = event["delta"]
            block = blocks[event["index"]]
            allowed = {"text": "text_delta", "thinking": ("thinking_delta", "signature_delta")}
            allowed["tool_use"] = "input_json_delta"
            assert delta["type"] in allowed[block["type"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                block["json"] = block.get("json", "") + delta["partial_json"]
        else:
            assert event == {"type": "content_block_stop", "index": open_index}
            open_index = None
    assert open_index is None
    return blocks


async def post_turn(base_url: str, body: dict[str, Any]) -> tuple[httpx.Response, list[Any]]:
    async with httpx.AsyncClient(timeout=20) as client:
        response = await client.post(
            base_url + "/v1/messages", params={"beta": "true"}, json=body, headers=HEADERS
        )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return response, sse_events(response.text)


ANSWER = script({"reasoning": "plan"}, {"tool_call": {"name": "Read", "arguments": {"arg": "a"}}})


@asynccontextmanager
async def served_by(vendor: str) -> AsyncIterator[Fleet]:
    """The gateway in front of one vendor's simulator. vLLM refuses a max_tokens above its
    max_model_len (4096 here): the operator says so with max_output_tokens."""
    if vendor != "vllm":
        async with vendor_fleet(vendor) as f:
            yield f
        return
    async with running_sim() as sim:
        config = gateway_config(
            provider_toml("vllm", sim.base_url, extra="max_output_tokens = 4096")
        )
        async with running_gateway(config) as gateway:
            yield Fleet(gateway=gateway, sims={"vllm": sim})


@pytest.mark.parametrize("vendor", ["vllm", "anthropic", "gemini"])
async def test_claude_codes_turn_is_served_as_is(vendor: str) -> None:
    async with served_by(vendor) as f:
        _, events = await post_turn(f.gateway.base_url, main_turn(ANSWER))
        blocks = check_grammar(events)
        # Gemini signs the call after it: its signature rides in a thinking block of its own.
        after = ["thinking"] if vendor == "gemini" else []
        assert [b["type"] for b in blocks] == ["thinking", "tool_use", *after]
        assert json.loads(blocks[1]["json"]) == {"arg": "a"} and blocks[1]["name"] == "Read"
        assert events[-2]["delta"]["stop_reason"] == "tool_use"
        sent = await f.last_body(vendor)
        _, small = await post_turn(f.gateway.base_url, small_turn(script({"text": "A title"})))
        assert check_grammar(small) == [{"type": "text", "text": "A title"}]
        dropped = {
            field: f.gateway.router.metrics.registry.get_sample_value(
                "gateway_front_dropped_fields_total", {"front": "messages", "field": field}
            )
            for field in ("context_management", "other")
        }
        # context_management is kept for Anthropic, not dropped; the unknown field is.
        assert dropped == {"context_management": None, "other": 1.0}
        headers = f.sims[vendor].engine.stats().last_request_headers
    # Anthropic's own fields reach Anthropic only, and no vendor sees the gateway's field.
    assert "anthropic_extras" not in sent
    if vendor != "anthropic":
        assert "cache_control" not in json.dumps(sent) and "context_management" not in sent
        assert not any("anthropic-beta" in h for h in headers)
    if vendor == "vllm":
        assert sent["max_tokens"] == 4096
        assert sent["chat_template_kwargs"] == {"enable_thinking": True}
        assert len(sent["tools"]) == 12
        roles = [m["role"] for m in sent["messages"]]
        assert roles == ["system", "user", "system"]
    elif vendor == "anthropic":
        assert sent["thinking"]["type"] == "enabled"
        assert sent["max_tokens"] <= 4096  # the model's output cap, not a refusal
        assert len(sent["tools"]) == 12
        assert sent["context_management"] == {
            "edits": [{"type": "clear_thinking_20251015", "keep": "all"}]
        }
        # Each breakpoint on the block built from the one it was on: the three system blocks
        # are one text here (the front joins them), the user's two texts one block, and the
        # environment (a system message, no breakpoint) the second system block.
        ephemeral = {"type": "ephemeral"}
        assert [b.get("cache_control") for b in sent["system"]] == [ephemeral, None]
        assert sent["system"][0]["text"].endswith("Help with software tasks.")
        (turn,) = sent["messages"]
        assert [b.get("cache_control") for b in turn["content"]] == [ephemeral]
        assert [t.get("cache_control") for t in sent["tools"]] == [None] * 11 + [ephemeral]
        beta = [h["anthropic-beta"] for h in headers if "anthropic-beta" in h]
        assert beta[0].split(",") == list(BETAS)
        # The session's user id reaches Anthropic as its own metadata.
        assert json.loads(sent["metadata"]["user_id"])["session_id"] == SESSION
    else:
        assert sent["generationConfig"]["thinkingConfig"]["includeThoughts"] is True
        assert len(sent["tools"][0]["functionDeclarations"]) == 12


async def test_count_tokens_is_the_gateways_prompt_estimate(stack: Stack) -> None:
    from trio_gateway.core.usage import estimate_prompt_tokens, estimate_tokens
    from trio_gateway.fronts.messages.request import translate

    body = main_turn("how many?")
    del body["stream"], body["max_tokens"]  # count_tokens takes neither
    url = stack.gateway.base_url + "/v1/messages/count_tokens"
    async with httpx.AsyncClient(timeout=10) as client:
        counted = await client.post(url, params={"beta": "true"}, json=body, headers=HEADERS)
        bare = await client.post(url, json={**body, "tools": []}, headers=HEADERS)
        missing = await client.post(url, json={**body, "model": "nope"}, headers=HEADERS)
    assert counted.status_code == 200, counted.text
    chat = translate(body, count_only=True).body
    tools = estimate_tokens(len(json.dumps(chat["tools"], ensure_ascii=False)))
    expected = estimate_prompt_tokens(chat["messages"], ("openai_compatible",)) + tools
    assert counted.json() == {"input_tokens": expected}
    assert 0 < bare.json()["input_tokens"] < expected
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    assert (await stack.sim_stats())["requests"] == 0  # nothing went upstream


async def test_a_client_leaving_mid_stream_aborts_the_upstream(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "trio_gateway.access")
    body = {**small_turn(LONG), "max_tokens": 4000}
    async with (
        httpx.AsyncClient() as client,
        client.stream("POST", stack.v1 + "/messages", json=body, headers=HEADERS) as response,
    ):
        assert response.status_code == 200
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("event: content_block_delta")
            if seen == 5:
                break
        generated_when_left = stack.sim.engine.stats().tokens_generated
    await wait_for_abort(stack.sim)
    stats = stack.sim.engine.stats()
    assert stats.tokens_generated < generated_when_left + 20
    assert stats.tokens_generated_after_client_left <= 2
    await wait_until(lambda: cancellations(stack.gateway, "client_gone") == 1)
    (access,) = [a for a in access_lines(caplog) if a["route"] == "POST /v1/messages"]
    assert (access["outcome"], access["alias"], access["provider"]) == (
        "cancelled",
        "agent-lite",
        "sim-a",
    )
    http = stack.gateway.router.metrics.registry.get_sample_value(
        "gateway_http_requests_total", {"route": "/v1/messages", "status": "200"}
    )
    assert http == 1.0
