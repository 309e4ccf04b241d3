"""The simulated Messages API keeps Anthropic's thinking rules in a tool loop: its thinking
blocks are signed, a tool loop with thinking on must send back the turn's thinking first
(refused otherwise, in Anthropic's words), and a changed block or signature is refused; the
``anthropic`` SDK reads the signed answer and sends it back as is."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
import trio

from trio_gateway.sim import SimConfig
from trio_gateway.sim.anthropic_request import thinking_signature
from trio_gateway.sim.anthropic_wire import parse_messages_request
from trio_gateway.sim.errors import ApiError

from .conftest import StartSim

MODEL = "claude-sim"
KEY = "sk-ant-test"
CONFIG = SimConfig(dialect="anthropic", served_model_name=MODEL, max_model_len=4096)
THINKING = {"type": "enabled", "budget_tokens": 1024}
TOOLS: Any = [{"name": "f", "input_schema": {"type": "object", "properties": {}}}]
SIGNED = {"type": "thinking", "thinking": "hm", "signature": thinking_signature("hm")}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgB"}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}


def loop(*assistant: Any, thinking: Any = THINKING) -> bytes:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": list(assistant)},
        RESULT,
    ]
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2048, "tools": TOOLS}
    body["messages"] = messages
    if thinking is not None:
        body["thinking"] = thinking
    return json.dumps(body).encode()


def refusal(raw: bytes) -> str | None:
    parsed = parse_messages_request(raw, CONFIG, version=b"2023-06-01")
    if not isinstance(parsed, ApiError):
        return None
    assert parsed.status == 400
    error = parsed.body["error"]
    assert error["type"] == "invalid_request_error"
    message: str = error["message"]
    return message


ACCEPTED = [
    loop(SIGNED, CALL),
    loop(REDACTED, CALL),
    loop(SIGNED, REDACTED, {"type": "text", "text": "x"}, CALL),
    # Without thinking, the turn needs none; with thinking off, none either.
    loop(CALL, thinking=None),
    loop(CALL, thinking={"type": "disabled"}),
]


@pytest.mark.parametrize("raw", ACCEPTED)
def test_a_tool_loop_sending_its_thinking_back_is_accepted(raw: bytes) -> None:
    assert refusal(raw) is None


def test_thinking_on_in_a_tool_loop_without_the_turns_thinking_is_refused() -> None:
    for assistant in ([CALL], [{"type": "text", "text": "x"}, CALL]):
        message = refusal(loop(*assistant))
        found = assistant[0]["type"]  # type: ignore[index]
        assert message == (
            "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
            f"`{found}`. When `thinking` is enabled, a final `assistant` message must start "
            "with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` "
            "blocks). We recommend you include thinking blocks from previous turns. To avoid "
            "this requirement, disable `thinking`. Please consult our documentation at "
            "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
        )


@pytest.mark.parametrize(
    "block",
    [
        SIGNED | {"signature": thinking_signature("hm")[:-4] + "AAAA"},
        SIGNED | {"thinking": "hm, edited"},
        SIGNED | {"signature": ""},
    ],
)
def test_a_changed_thinking_block_is_refused(block: dict[str, Any]) -> None:
    assert (
        refusal(loop(block, CALL))
        == "messages.1.content.0: Invalid `signature` in `thinking` block"
    )


def test_a_thinking_block_without_its_signature_is_refused() -> None:
    block = {"type": "thinking", "thinking": "hm"}
    assert refusal(loop(block, CALL)) == "messages.1.content.0.thinking.signature: Field required"


async def test_the_sdk_sends_a_signed_answer_back_and_the_loop_thinks_on(
    start_sim: StartSim,
) -> None:
    sim = await start_sim(dialect="anthropic", served_model_name=MODEL, api_key=KEY)
    script = {"steps": [{"reasoning": "look it up"}, {"tool_call": {"name": "f", "arguments": {}}}]}
    question: Any = {"role": "user", "content": f"go <sim>{json.dumps(script)}</sim>"}

    def run() -> Any:
        client = anthropic.Anthropic(base_url=sim.base_url, api_key=KEY, max_retries=0)
        kwargs: Any = {"model": MODEL, "max_tokens": 2048, "thinking": THINKING, "tools": TOOLS}
        with client.messages.stream(messages=[question], **kwargs) as stream:
            first = stream.get_final_message()
        call: Any = first.content[-1]
        result = {"type": "tool_result", "tool_use_id": call.id, "content": "ok"}
        history: Any = [
            question,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ]
        second = client.messages.create(messages=history, **kwargs)
        # The same turn without its thinking: what Anthropic refuses.
        history[1] = {"role": "assistant", "content": [call]}
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(messages=history, **kwargs)
        return first, second, refused.value

    first, second, refused = await trio.to_thread.run_sync(run)
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert first.content[0].signature == thinking_signature("look it up")
    assert [b.type for b in second.content] == ["thinking", "tool_use"]
    assert "Expected `thinking` or `redacted_thinking`" in refused.message


def managed(edits: Any, thinking: Any = THINKING) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 2048,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "context_management": {"edits": edits},
    }
    if thinking is not None:
        body["thinking"] = thinking
    return json.dumps(body).encode()


CLEAR_THINKING = {"type": "clear_thinking_20251015", "keep": "all"}
CLEAR_TOOLS = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1}}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (managed([CLEAR_THINKING, CLEAR_TOOLS]), None),
        (managed([CLEAR_TOOLS], thinking=None), None),
        (managed([CLEAR_THINKING], thinking=None), "requires thinking to be enabled"),
        (managed([CLEAR_TOOLS, CLEAR_THINKING]), "must come first"),
        (managed([{"type": "clear_everything"}]), "edits.0.type: Input should be"),
        (managed("all"), "edits: Input should be a valid list"),
    ],
)
def test_context_management_as_anthropic_checks_it(raw: bytes, problem: str | None) -> None:
    found = refusal(raw)
    assert found == problem if problem is None else problem in (found or "")
