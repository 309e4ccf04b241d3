"""The Vercel AI SDK 7 (``ai``, ``@ai-sdk/openai``, ``@ai-sdk/anthropic``; pinned in
``tests/clients/node/package.json``) against the gateway, used as its docs say: ``generateText``
and ``streamText`` with a tool that has an ``execute`` and a loop bounded by ``stopWhen:
isStepCount(4)``, and a chat carried on with the answer's ``responseMessages``, for the three
models a user picks: ``openai(...)`` (the Responses API, ``store`` left at its default, true),
``openai.chat(...)`` and ``@ai-sdk/anthropic``.

The simulator's script makes the model call the tool, and the tool's output holds the script
of the answer, so the final text proves the tool ran and its result went back. Every case runs
in one ``node`` process (``node/ai_sdk.mjs``); each test here judges one case: no error, no
warning from the SDK (``onWarning``, each step's ``warnings``), what the model said and did,
and the gateway's usage record of each request ``completed``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.clients.conversation import (
    AFTER_TOOL,
    ANSWER,
    CALL,
    CITY,
    FIRST,
    HELD,
    HELD_THOUGHT,
    OTHER_CITY,
    SECOND,
    THOUGHT,
    TOOL,
    TOOL_OUTPUT,
    TWO_CALLS,
)
from tests.clients.node_clients import node_clients
from tests.clients.stack import ClientStack, client_stack

NODE_TIMEOUT_S = 180
THINKING = {"anthropic": {"thinking": {"type": "enabled", "budgetTokens": 1024}}}
ENDPOINT = {"responses": "responses", "chat": "chat", "anthropic": "messages"}


def case(name: str, api: str, mode: str, prompts: list[str], **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "api": api,
        "mode": mode,
        "prompts": prompts,
        "alias": "agent-lite",
        "toolName": TOOL,
        **more,
    }


TOOL_LOOPS = [
    case(f"{api}-{mode}-tools", api, mode, [CALL], toolOutput=TOOL_OUTPUT)
    for api in ("responses", "chat", "anthropic")
    for mode in ("generate", "stream")
]
TWO_CALLS_CASES = [
    case(f"{api}-{mode}-two-calls", api, mode, [TWO_CALLS], toolOutput=TOOL_OUTPUT)
    for api in ENDPOINT
    for mode in ("generate", "stream")
]
TURNS = [case(f"{api}-turns", api, "generate", [FIRST, SECOND]) for api in ENDPOINT]
THINKING_LOOPS = [
    # Thinking asked for, from vLLM (unsigned thinking) and from Anthropic (signed, wanted back).
    case(
        f"anthropic-{mode}-thinking",
        "anthropic",
        mode,
        [CALL],
        toolOutput=TOOL_OUTPUT,
        providerOptions=THINKING,
    )
    for mode in ("generate", "stream")
] + [
    case(
        f"claude-{mode}-thinking",
        "anthropic",
        mode,
        [CALL],
        toolOutput=TOOL_OUTPUT,
        providerOptions=THINKING,
        alias="claude",
    )
    for mode in ("generate", "stream")
]
FILTERED = [
    case(
        f"filtered-{mode}",
        "anthropic",
        mode,
        [HELD],
        toolOutput=TOOL_OUTPUT,
        providerOptions=THINKING,
        alias="filtered",
        maxSteps=1,
    )
    for mode in ("generate", "stream")
]
# The AI SDK's zero-data-retention way: store: false, reasoning asked back as encrypted_content,
# and the whole conversation sent each turn.
STATELESS_OPTIONS = {"openai": {"store": False, "include": ["reasoning.encrypted_content"]}}
STATELESS = [
    case(
        f"responses-{mode}-stateless",
        "responses",
        mode,
        [CALL],
        toolOutput=TOOL_OUTPUT,
        providerOptions=STATELESS_OPTIONS,
    )
    for mode in ("generate", "stream")
]
CASES = TOOL_LOOPS + TWO_CALLS_CASES + TURNS + THINKING_LOOPS + FILTERED + STATELESS


pytestmark = pytest.mark.clients


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClientStack, dict[str, Any]]]:
    clients = node_clients(tmp_path_factory.mktemp("ai-sdk"))
    if clients is None:
        pytest.skip("needs npm: the AI SDK and Node come from the npm registry")
    with client_stack() as stack:
        request = {"baseURL": stack.base_url, "cases": CASES}
        yield stack, clients.run("ai_sdk.mjs", request, timeout_s=NODE_TIMEOUT_S)


def parts(step: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in step["content"] if p["type"] == kind]


def judged(ran: tuple[ClientStack, dict[str, Any]], name: str, api: str) -> dict[str, Any]:
    """The case's result, after what every case must show: no error, no warning, every request
    answered 200 and recorded as completed on the front it went to."""
    stack, results = ran
    result: dict[str, Any] = results[name]
    assert result["error"] is None, result["error"]
    assert result["streamErrors"] == []
    assert result["warnings"] == []
    assert [w for turn in result["turns"] for s in turn["steps"] for w in s["warnings"]] == []
    requests = result["requests"]
    assert [r["status"] for r in requests] == [200] * len(requests)
    records = stack.records.wait_for(name, len(requests))
    assert sorted(r.request_id for r in records) == sorted(r["id"] for r in requests)
    assert {(r.outcome, r.error_code, r.endpoint) for r in records} == {
        ("completed", None, ENDPOINT[api])
    }
    return result


def assert_tool_loop(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The model called the tool, the SDK ran it once with the model's arguments, and the
    answer came from its output; the steps of the loop, returned."""
    assert result["executed"] == [{"city": CITY}]
    [turn] = result["turns"]
    assert turn["text"].strip() == ANSWER
    called, answered = turn["steps"]
    assert called["finishReason"] == "tool-calls"
    [call] = parts(called, "tool-call")
    assert (call["toolName"], call["input"]) == (TOOL, {"city": CITY})
    [output] = parts(called, "tool-result")
    assert output["output"] == TOOL_OUTPUT
    assert answered["finishReason"] == "stop"
    steps: list[dict[str, Any]] = turn["steps"]
    return steps


def reasoning(step: dict[str, Any]) -> str:
    return "".join(p["text"] for p in parts(step, "reasoning"))


@pytest.mark.parametrize("name", [c["name"] for c in TOOL_LOOPS if c["api"] == "responses"])
def test_openai_responses_tool_loop(ran: Any, name: str) -> None:
    steps = assert_tool_loop(judged(ran, name, "responses"))
    # Each answer's reasoning item (what the SDK refers back to): its text is a summary the
    # SDK did not ask for.
    assert [len(parts(s, "reasoning")) for s in steps] == [1, 1]


@pytest.mark.parametrize("name", [c["name"] for c in STATELESS])
def test_openai_responses_tool_loop_with_store_false(ran: Any, name: str) -> None:
    """Every reasoning item carries encrypted_content when it is asked for, though vLLM signs
    nothing: the SDK skips with a warning a reasoning part without one (judged finds none),
    and sends each back in the next turn's input, which the gateway takes."""
    result = judged(ran, name, "responses")
    steps = assert_tool_loop(result)
    assert [len(parts(s, "reasoning")) for s in steps] == [1, 1]
    first, second = result["requests"]
    assert first["body"]["store"] is False
    sent_back = [i for i in second["body"]["input"] if i.get("type") == "reasoning"]
    assert len(sent_back) == 1
    assert sent_back[0]["encrypted_content"].startswith("tgw1.")


@pytest.mark.parametrize("name", [c["name"] for c in TOOL_LOOPS if c["api"] == "chat"])
def test_openai_chat_tool_loop(ran: Any, name: str) -> None:
    assert_tool_loop(judged(ran, name, "chat"))


@pytest.mark.parametrize("name", [c["name"] for c in TOOL_LOOPS if c["api"] == "anthropic"])
def test_anthropic_tool_loop_without_thinking_has_no_thinking(ran: Any, name: str) -> None:
    steps = assert_tool_loop(judged(ran, name, "anthropic"))
    # Thinking was not enabled: Anthropic sends no thinking blocks then.
    assert [parts(s, "reasoning") for s in steps] == [[], []]
    assert all(s["responseId"].startswith("msg_") for s in steps)


@pytest.mark.parametrize(
    ("name", "api"),
    [(f"{api}-{mode}-two-calls", api) for api in ENDPOINT for mode in ("generate", "stream")],
)
def test_two_calls_in_one_turn(ran: Any, name: str, api: str) -> None:
    result = judged(ran, name, api)
    # Both run, in the model's order, and both results went back (one request more).
    assert result["executed"] == [{"city": CITY}, {"city": OTHER_CITY}]
    [turn] = result["turns"]
    called, answered = turn["steps"]
    calls = [(p["toolName"], p["input"]) for p in parts(called, "tool-call")]
    assert calls == [(TOOL, {"city": CITY}), (TOOL, {"city": OTHER_CITY})]
    assert len(parts(called, "tool-result")) == 2
    assert (answered["finishReason"], turn["text"].strip()) == ("stop", ANSWER)


@pytest.mark.parametrize(
    ("name", "api"),
    [
        ("responses-turns", "responses"),
        pytest.param("chat-turns", "chat"),
        ("anthropic-turns", "anthropic"),
    ],
)
def test_a_chat_carried_on_with_the_response_messages(ran: Any, name: str, api: str) -> None:
    result = judged(ran, name, api)
    first, second = result["turns"]
    assert (first["text"].strip(), second["text"].strip()) == ("Hello there", "Hello again")
    assert [m["role"] for m in first["responseMessages"]] == ["assistant"]
    # The second request carried the first answer back.
    assert "Hello there" in json.dumps(result["requests"][1]["body"])
    if api == "anthropic":
        steps = [s for t in (first, second) for s in t["steps"]]
        assert [parts(s, "reasoning") for s in steps] == [[], []]
        assert all(s["responseId"].startswith("msg_") for s in steps)


@pytest.mark.parametrize(
    "name",
    [c["name"] for c in THINKING_LOOPS],
)
def test_anthropic_tool_loop_with_thinking(ran: Any, name: str) -> None:
    result = judged(ran, name, "anthropic")
    steps = assert_tool_loop(result)
    assert [reasoning(s) for s in steps] == [THOUGHT, AFTER_TOOL]
    # The thinking went back with the tool's result, signed as it came (the Anthropic
    # simulator refuses a tool loop without it).
    signatures = [
        p["providerMetadata"]["anthropic"]["signature"] for p in parts(steps[0], "reasoning")
    ]
    [assistant] = [m for m in result["requests"][1]["body"]["messages"] if m["role"] == "assistant"]
    thinking = [b for b in assistant["content"] if b["type"] == "thinking"]
    assert [(b["thinking"], b["signature"]) for b in thinking] == [(THOUGHT, s) for s in signatures]
    if name.startswith("claude"):
        # And from the gateway to Anthropic: first in the turn that called the tool.
        stack, _ = ran
        [sent] = stack.sent_upstream("claude", result["requests"][1]["id"])
        assert sent["messages"][-2]["content"][0] == {
            "type": "thinking",
            "thinking": THOUGHT,
            "signature": signatures[0],
        }


@pytest.mark.parametrize("name", [c["name"] for c in FILTERED])
def test_a_filtered_alias_keeps_the_thinking_before_the_tool_call(ran: Any, name: str) -> None:
    result = judged(ran, name, "anthropic")
    [turn] = result["turns"]
    [step] = turn["steps"]
    kinds = [p["type"] for p in step["content"] if p["type"] in ("reasoning", "tool-call")]
    assert kinds == ["reasoning", "tool-call"]
    assert reasoning(step) == HELD_THOUGHT
