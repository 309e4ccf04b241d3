"""``POST /v1/responses`` judged by the official openai SDK: ``responses.create`` whole and
streamed, ``responses.stream`` with ``get_final_response()``, sync (in a thread) and async,
against a gateway routed to the simulator (vLLM's wire, Qwen3-like reasoning)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import trio
from openai import AsyncOpenAI, OpenAI

from tests.e2e.harness import Stack, script, wait_until

ANSWER = script({"reasoning": "think 思考"}, {"text": "Hello 世界 🌍"})
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
LONG = script({"text": " ".join(f"word{i}" for i in range(30))})
CALL = script(
    {"reasoning": "I should look it up"},
    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
)


def client_for(stack: Stack) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)


async def test_whole_text_answer_with_reasoning_and_usage(stack: Stack) -> None:
    client = client_for(stack)
    response = await client.responses.create(
        model="agent-lite", input=ANSWER, instructions="Be brief.", reasoning={"effort": "low"}
    )
    assert response.status == "completed"
    assert response.object == "response" and response.model == "agent-lite"
    assert response.id.startswith("resp_")
    assert response.output_text == "Hello 世界 🌍"
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]
    reasoning: Any = response.output[0]
    assert reasoning.content[0].text == "think 思考"
    assert response.instructions == "Be brief."
    usage = response.usage
    assert usage is not None and usage.output_tokens > 0 and usage.input_tokens > 0
    assert usage.output_tokens_details.reasoning_tokens == 3  # "think", " 思", "考"
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # The chat request the simulator got: instructions first, as a system message.
    stats = await stack.sim_stats()
    sent = stats["last_request_body"]
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    await client.close()


async def test_stream_helper_accepts_every_event(stack: Stack) -> None:
    client = client_for(stack)
    types: list[str] = []
    text: list[str] = []
    async with client.responses.stream(model="agent-lite", input=ANSWER) as stream:
        async for event in stream:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                text.append(event.delta)
        final = await stream.get_final_response()
    assert "".join(text) == "Hello 世界 🌍" == final.output_text
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for expected in (
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert expected in types
    assert final.usage is not None and final.usage.output_tokens > 0
    await client.close()


async def test_create_stream_numbers_every_event(stack: Stack) -> None:
    client = client_for(stack)
    stream = await client.responses.create(
        model="agent-lite", input=ANSWER, stream=True, reasoning={"summary": "auto"}
    )
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    # A summary was asked for: the thinking comes as the reasoning item's summary.
    assert "response.reasoning_summary_text.delta" in types
    assert "response.reasoning_summary_part.done" in types
    done: Any = events[-1]
    assert done.type == "response.completed"
    assert done.response.output[0].summary[0].text == "think 思考"
    await client.close()


async def test_a_cut_answer_is_incomplete(stack: Stack) -> None:
    client = client_for(stack)
    # Past the API's floor of 16 output tokens.
    response = await client.responses.create(
        model="agent-lite",
        input=LONG,
        max_output_tokens=16,
        reasoning={"effort": "none"},
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.max_output_tokens == 16
    stream = await client.responses.create(
        model="agent-lite",
        input=LONG,
        max_output_tokens=16,
        reasoning={"effort": "none"},
        stream=True,
    )
    events = [event async for event in stream]
    last: Any = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"
    await client.close()


async def test_errors_are_in_openai_shape(stack: Stack) -> None:
    client = client_for(stack)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.create(model="nope", input="hi")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        no_role: Any = [{"type": "message"}]
        await client.responses.create(model="agent-lite", input=no_role)
    assert bad.value.code == "invalid_request"
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.responses.create(model="agent-lite", input="hi", previous_response_id="x")
    assert unknown.value.code == "response_not_found"
    await client.close()
    async with httpx.AsyncClient() as raw:
        answer = await raw.post(stack.v1 + "/responses", content=b"{not json")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_json"


async def test_async_tool_call_streamed(stack: Stack) -> None:
    client = client_for(stack)
    deltas: list[str] = []
    async with client.responses.stream(
        model="agent-lite", input=CALL, tools=[WEATHER], reasoning={"effort": "low"}
    ) as stream:
        async for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.delta)
        final = await stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) == 1
    call: Any = calls[0]
    assert call.name == "get_weather" and call.call_id
    assert json.loads(call.arguments) == {"city": "Paris"} == json.loads("".join(deltas))
    # Qwen3's "\n\n" before the call is no message.
    assert [item.type for item in final.output] == ["reasoning", "function_call"]
    await client.close()


def sync_session(base_url: str) -> dict[str, Any]:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    whole = client.responses.create(model="agent-lite", input=script({"text": "plain answer"}))
    with client.responses.stream(model="agent-lite", input=ANSWER) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    return {"whole": whole.output_text, "streamed": final.output_text}


async def test_sync_sdk(stack: Stack) -> None:
    result = await trio.to_thread.run_sync(sync_session, stack.v1)
    assert result == {"whole": "plain answer", "streamed": "Hello 世界 🌍"}


async def test_a_client_that_leaves_mid_stream_aborts_the_upstream(stack: Stack) -> None:
    body = {
        "model": "agent-lite",
        "input": script({"text": "start"}, {"text_tokens": 100000}),
        "stream": True,
    }
    async with (
        httpx.AsyncClient(timeout=10) as client,
        client.stream("POST", stack.v1 + "/responses", json=body) as response,
    ):
        assert response.status_code == 200
        async for chunk in response.aiter_bytes():
            if b"response.output_text.delta" in chunk:
                break
    with trio.fail_after(10):
        stats = await stack.sim.engine.wait_until(lambda s: s.aborts == 1)
    assert stats.tokens_generated < 1000
    router = stack.gateway.router
    await wait_until(lambda: router.upstreams["sim-a"].statistics().in_flight == 0)


async def test_an_upstream_cut_mid_stream_is_a_failed_response(stack: Stack) -> None:
    client = client_for(stack)
    stream = await client.responses.create(
        model="agent-lite", input=script({"text": "a b"}, {"drop": True}), stream=True
    )
    events = [event async for event in stream]
    failed: Any = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.status == "failed"
    assert failed.response.error.code == "server_error"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    await client.close()


async def test_a_block_filter_ends_the_stream_as_a_filtered_answer() -> None:
    from tests.e2e.harness import gateway_config, provider_toml, running_gateway, running_sim

    async with running_sim() as sim:
        providers = provider_toml("sim-a", sim.base_url).replace(
            "[[aliases.agent-lite.providers]]",
            'output_filters = ["secrets"]\n[[aliases.agent-lite.providers]]',
            1,
        )
        server = '[filters.secrets]\npatterns = ["falcon"]\naction = "block"\n'
        config = gateway_config(providers, server=server)
        async with running_gateway(config) as gateway:
            client = AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="x", max_retries=0)
            stream = await client.responses.create(
                model="agent-lite",
                input=script({"text": "the code name is falcon indeed"}),
                reasoning={"effort": "none"},
                stream=True,
            )
            events = [event async for event in stream]
            await client.close()
    last: Any = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "content_filter"
    assert "falcon" not in json.dumps(last.response.model_dump())
