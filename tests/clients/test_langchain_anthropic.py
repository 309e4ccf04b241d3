"""langchain-anthropic (``ChatAnthropic``, pinned in pyproject's test extra) against the
gateway's Messages front, as its docs use it: ``base_url`` at the gateway, tools with
``bind_tools`` and a loop that runs each of the message's ``tool_calls`` and feeds the
``ToolMessage`` back, whole (``invoke``) and streamed (``stream``, the chunks added up), with
thinking off and on (``thinking={"type": "enabled", "budget_tokens": ...}``).

Thinking goes back with the tool's result as the client got it: from Anthropic (the ``claude``
alias) signed, and the Anthropic simulator checks the signature, as Anthropic does."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.tools import tool
from pydantic import SecretStr

from tests.clients.conversation import (
    AFTER_TOOL,
    ANSWER,
    CALL,
    CITY,
    HELD,
    HELD_THOUGHT,
    ITEM_3,
    OTHER_CITY,
    THOUGHT,
    TOOL,
    TOOL_OUTPUT,
    TWO_CALLS,
)
from tests.clients.stack import ClientStack, client_stack

THINKING: dict[str, Any] = {"type": "enabled", "budget_tokens": 1024}
MAX_STEPS = 3
_request_ids = itertools.count()


pytestmark = pytest.mark.clients


@pytest.fixture(scope="module")
def stack() -> Iterator[ClientStack]:
    with client_stack() as served:
        yield served


@tool(TOOL)
def weather(city: str) -> str:
    """The weather in a city."""
    return TOOL_OUTPUT


def chat_model(stack: ClientStack, alias: str, request_id: str, thinking: bool) -> Any:
    # As its docs write it; mypy knows these two fields by their aliases (`model_name`,
    # `max_tokens_to_sample`) only.
    llm = ChatAnthropic(  # type: ignore[call-arg]
        model=alias,
        base_url=stack.base_url,
        api_key=SecretStr("tgw-unused"),
        max_tokens=2000,
        max_retries=0,
        default_headers={"x-request-id": request_id},
        thinking=THINKING if thinking else None,
    )
    return llm.bind_tools([weather])


def ask(llm: Any, messages: list[BaseMessage], *, streamed: bool) -> AIMessage:
    if not streamed:
        answer: AIMessage = llm.invoke(messages)
        return answer
    whole: AIMessageChunk | None = None
    for chunk in llm.stream(messages):
        whole = chunk if whole is None else whole + chunk
    assert whole is not None
    return whole


def tool_loop(
    stack: ClientStack, alias: str, prompt: str, *, thinking: bool, streamed: bool, steps: int
) -> tuple[list[AIMessage], str]:
    """The model's messages until one calls no tool (at most ``steps``), each call run and its
    result fed back."""
    request_id = f"langchain-{next(_request_ids)}"
    llm = chat_model(stack, alias, request_id, thinking)
    messages: list[BaseMessage] = [HumanMessage(prompt)]
    answers: list[AIMessage] = []
    for _ in range(steps):
        answer = ask(llm, messages, streamed=streamed)
        answers.append(answer)
        messages.append(answer)
        if not answer.tool_calls:
            break
        messages.extend(weather.invoke(call) for call in answer.tool_calls)
    return answers, request_id


def blocks(message: AIMessage, kind: str) -> list[dict[str, Any]]:
    content = message.content if isinstance(message.content, list) else []
    return [b for b in content if isinstance(b, dict) and b.get("type") == kind]


def text_of(message: AIMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "".join(b["text"] for b in blocks(message, "text"))


def assert_answered_from_the_tool(answers: list[AIMessage]) -> None:
    called, answered = answers
    assert [(c["name"], c["args"]) for c in called.tool_calls] == [(TOOL, {"city": CITY})]
    assert answered.tool_calls == []
    assert text_of(answered).strip() == ANSWER


def assert_completed(stack: ClientStack, request_id: str, requests: int) -> None:
    records = stack.records.wait_for(request_id, requests)
    assert [(r.outcome, r.error_code, r.endpoint) for r in records] == [
        ("completed", None, "messages")
    ] * requests


@pytest.mark.parametrize("streamed", [False, True], ids=["invoke", "stream"])
def test_a_tool_loop_without_thinking_gets_no_thinking(stack: ClientStack, streamed: bool) -> None:
    answers, request_id = tool_loop(
        stack, "agent-lite", CALL, thinking=False, streamed=streamed, steps=MAX_STEPS
    )
    assert_answered_from_the_tool(answers)
    assert_completed(stack, request_id, 2)
    # Thinking was not enabled: Anthropic sends no thinking blocks then.
    assert [blocks(a, "thinking") for a in answers] == [[], []]
    if not streamed:
        assert all(a.response_metadata["id"].startswith("msg_") for a in answers)


@pytest.mark.parametrize("streamed", [False, True], ids=["invoke", "stream"])
@pytest.mark.parametrize("alias", ["agent-lite", "claude"])
def test_a_tool_loop_with_thinking(stack: ClientStack, alias: str, streamed: bool) -> None:
    answers, request_id = tool_loop(
        stack, alias, CALL, thinking=True, streamed=streamed, steps=MAX_STEPS
    )
    assert_answered_from_the_tool(answers)
    assert_completed(stack, request_id, 2)
    thinking = [blocks(a, "thinking") for a in answers]
    assert [[b["thinking"] for b in t] for t in thinking] == [[THOUGHT], [AFTER_TOOL]]
    if alias == "claude":
        # Signed by Anthropic, and sent back so: the tool loop's second request reached the
        # Anthropic simulator with the thinking first in the turn that called the tool, its
        # signature the one the client got (the simulator checks it too).
        [[signed], _] = thinking
        assert signed["signature"]
        _, second = stack.sent_upstream("claude", request_id)
        turn = second["messages"][-2]
        assert turn["role"] == "assistant"
        assert turn["content"][0] == {
            "type": "thinking",
            "thinking": THOUGHT,
            "signature": signed["signature"],
        }


@pytest.mark.parametrize("streamed", [False, True], ids=["invoke", "stream"])
def test_two_calls_in_one_turn(stack: ClientStack, streamed: bool) -> None:
    answers, request_id = tool_loop(
        stack, "agent-lite", TWO_CALLS, thinking=True, streamed=streamed, steps=MAX_STEPS
    )
    called, answered = answers
    assert [c["args"] for c in called.tool_calls] == [{"city": CITY}, {"city": OTHER_CITY}]
    assert text_of(answered).strip() == ANSWER
    assert_completed(stack, request_id, 2)
    # Both results went back, each for its call.
    sent = stack.sent_upstream("agent-lite", request_id)[-1]["messages"]
    results = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert results == [c["id"] for c in called.tool_calls]


@ITEM_3
@pytest.mark.parametrize("streamed", [False, True], ids=["invoke", "stream"])
def test_a_filtered_alias_keeps_the_thinking_before_the_tool_call(
    stack: ClientStack, streamed: bool
) -> None:
    [called], request_id = tool_loop(
        stack, "filtered", HELD, thinking=True, streamed=streamed, steps=1
    )
    assert_completed(stack, request_id, 1)
    content = called.content if isinstance(called.content, list) else []
    kinds = [b["type"] for b in content if isinstance(b, dict)]
    assert kinds == ["thinking", "tool_use"]
    assert [b["thinking"] for b in blocks(called, "thinking")] == [HELD_THOUGHT]
