"""The OpenAI Agents SDK (``openai-agents``, pinned in pyproject's test extra) against the
gateway, as its docs set up a provider of one's own: an ``AsyncOpenAI`` client whose
``base_url`` is the gateway, a model over the Responses API (``OpenAIResponsesModel``) or over
Chat Completions (``OpenAIChatCompletionsModel``), tracing off (it would send traces to
OpenAI), an agent with a function tool, ``Runner.run`` (and ``Runner.run_streamed``).

The model (the simulator, as ``agent-lite``: it reasons first) calls the tool, the SDK runs it,
and the agent's final output is the answer scripted in the tool's output; a second turn goes on
from ``result.to_input_list()``, as the SDK's docs carry a conversation on."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    ItemHelpers,
    MessageOutputItem,
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    RunResult,
    RunResultStreaming,
    TResponseInputItem,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from tests.clients.conversation import ANSWER, CALL, CITY, FIRST, SECOND, TOOL, TOOL_OUTPUT
from tests.clients.stack import ClientStack, client_stack

RUN_TIMEOUT_S = 60
ENDPOINT = {"responses": "responses", "chat": "chat"}
_request_ids = itertools.count()


pytestmark = pytest.mark.clients


@pytest.fixture(scope="module")
def stack() -> Iterator[ClientStack]:
    # A process-wide switch of the SDK's: without it, it would export traces to OpenAI.
    set_tracing_disabled(True)
    with client_stack() as served:
        yield served


def model_for(api: str, client: AsyncOpenAI) -> Model:
    if api == "responses":
        return OpenAIResponsesModel(model="agent-lite", openai_client=client)
    return OpenAIChatCompletionsModel(model="agent-lite", openai_client=client)


def agent_with_a_tool(api: str, client: AsyncOpenAI, calls: list[str]) -> Agent[Any]:
    @function_tool(name_override=TOOL)
    def weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return TOOL_OUTPUT

    return Agent(
        name="Assistant",
        instructions="Answer from the tools.",
        tools=[weather],
        model=model_for(api, client),
    )


async def run(
    stack: ClientStack,
    api: str,
    request_id: str,
    turns: list[str],
    calls: list[str],
    *,
    streamed: bool,
) -> list[RunResult | RunResultStreaming]:
    """Each turn run to its end, the next one going on from the last one's items."""
    client = AsyncOpenAI(
        base_url=stack.v1,
        api_key="tgw-unused",
        max_retries=0,
        default_headers={"x-request-id": request_id},
    )
    agent = agent_with_a_tool(api, client, calls)
    results: list[RunResult | RunResultStreaming] = []
    items: list[TResponseInputItem] = []
    async with client:
        for turn in turns:
            items.append({"role": "user", "content": turn})
            if streamed:
                streaming = Runner.run_streamed(agent, items)
                async for _ in streaming.stream_events():
                    pass
                results.append(streaming)
            else:
                results.append(await Runner.run(agent, items))
            items = results[-1].to_input_list()
    return results


def ran(
    stack: ClientStack, api: str, turns: list[str], *, streamed: bool
) -> tuple[list[RunResult | RunResultStreaming], list[str], str]:
    request_id = f"agents-{next(_request_ids)}"
    calls: list[str] = []

    async def bounded() -> list[RunResult | RunResultStreaming]:
        return await asyncio.wait_for(
            run(stack, api, request_id, turns, calls, streamed=streamed), RUN_TIMEOUT_S
        )

    return asyncio.run(bounded()), calls, request_id


def kinds(result: RunResult | RunResultStreaming) -> list[str]:
    """The run's items, less a streamed chat's message of whitespace alone: vLLM streams
    Qwen3's blank line after its thinking as content (before the tool call), and the chat
    front passes vLLM's content on as it comes."""
    return [
        item.type
        for item in result.new_items
        if not (
            isinstance(item, MessageOutputItem)
            and not ItemHelpers.text_message_output(item).strip()
        )
    ]


def assert_completed(stack: ClientStack, request_id: str, requests: int, api: str) -> None:
    records = stack.records.wait_for(request_id, requests)
    assert [(r.outcome, r.error_code, r.endpoint) for r in records] == [
        ("completed", None, ENDPOINT[api])
    ] * requests


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_an_agent_calls_its_tool_and_answers_from_it(
    stack: ClientStack, api: str, streamed: bool
) -> None:
    [result], calls, request_id = ran(stack, api, [CALL], streamed=streamed)
    assert calls == [CITY]
    assert str(result.final_output).strip() == ANSWER
    assert kinds(result) == [
        "reasoning_item",
        "tool_call_item",
        "tool_call_output_item",
        "reasoning_item",
        "message_output_item",
    ]
    assert_completed(stack, request_id, 2, api)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_a_conversation_goes_on_from_the_last_results_items(stack: ClientStack, api: str) -> None:
    (first, second), calls, request_id = ran(stack, api, [FIRST, SECOND], streamed=False)
    assert calls == []
    assert (str(first.final_output).strip(), str(second.final_output).strip()) == (
        "Hello there",
        "Hello again",
    )
    # What the second turn went on from, and sent back.
    assert kinds(first) == ["reasoning_item", "message_output_item"]
    assert_completed(stack, request_id, 2, api)
