"""The Responses API's WebSocket mode judged by the openai SDK (``client.responses.connect()``,
sync in a thread, async on asyncio in a thread), every event read through its strict types,
against the gateway routed to the simulator: a tool loop that sends only new input with
``store: false``, two lanes interleaved on one socket, a fork, and a socket that closes while
an answer streams (the simulator aborts it)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
from openai import omit
from openai.types.responses.response import Response

from tests.e2e.harness import Stack, script, wait_until
from tests.e2e.responses_socket import (
    TOOL,
    aread_until_done,
    arecv,
    async_client,
    http_posts,
    in_asyncio,
    read_until_done,
    socket_creates,
    sync_client,
    tool_step,
)
from tests.e2e.test_cancellation import LONG, wait_for_abort
from trio_gateway.fronts.responses.service import service_of

STEPS = 3


def tool_loop(v1: str) -> list[Response]:
    """Three calls, then the answer: each turn sends its previous response's id and only the
    call's output, with store: false."""
    client = sync_client(v1)
    responses: list[Response] = []
    with client.responses.connect() as connection:
        new_input: Any = [{"role": "user", "content": "weather? " + tool_step(0, last=False)}]
        previous: str | None = None
        for step in range(STEPS + 1):
            connection.response.create(
                model="agent-lite",
                input=new_input,
                tools=[TOOL],
                store=False,
                previous_response_id=previous if previous is not None else omit,
            )
            events = read_until_done(connection)
            done = events[-1]
            assert done.type == "response.completed", done
            assert [e.sequence_number for e in events] == list(range(len(events)))
            response = done.response
            responses.append(response)
            previous = response.id
            if step == STEPS:
                break
            call = next(item for item in response.output if item.type == "function_call")
            assert call.name == "get_weather"
            result = f"18C in city{step}, " + tool_step(step + 1, last=step + 1 == STEPS)
            new_input = [
                {"type": "function_call_output", "call_id": call.call_id, "output": result}
            ]
    return responses


async def atool_loop(v1: str) -> list[Response]:
    """:func:`tool_loop` with the async client."""
    client = async_client(v1)
    responses: list[Response] = []
    async with client.responses.connect() as connection:
        new_input: Any = [{"role": "user", "content": "weather? " + tool_step(0, last=False)}]
        previous: str | None = None
        for step in range(STEPS + 1):
            await connection.response.create(
                model="agent-lite",
                input=new_input,
                tools=[TOOL],
                store=False,
                previous_response_id=previous if previous is not None else omit,
            )
            events = await aread_until_done(connection)
            assert events[-1].type == "response.completed", events[-1]
            assert [e.sequence_number for e in events] == list(range(len(events)))
            response = events[-1].response
            responses.append(response)
            previous = response.id
            if step == STEPS:
                break
            call = next(item for item in response.output if item.type == "function_call")
            result = f"18C in city{step}, " + tool_step(step + 1, last=step + 1 == STEPS)
            new_input = [
                {"type": "function_call_output", "call_id": call.call_id, "output": result}
            ]
    await client.close()
    return responses


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_tool_loop_sends_only_new_input_with_store_false(stack: Stack, mode: str) -> None:
    if mode == "sync":
        responses = await trio.to_thread.run_sync(tool_loop, stack.v1)
    else:
        responses = await trio.to_thread.run_sync(in_asyncio(lambda: atool_loop(stack.v1)))
    assert responses[-1].output_text == f"done after {STEPS} calls"
    assert all((r.model_extra or {})["store"] is False for r in responses)
    # The simulator got the whole conversation each turn, rebuilt from the socket's memory.
    sent = (await stack.sim_stats())["last_request_body"]["messages"]
    assert [m["role"] for m in sent] == ["user"] + ["assistant", "tool"] * STEPS
    # Nothing went to the store, and nothing over HTTP.
    store = service_of(stack.gateway.router).store
    for response in responses:
        assert await store.get("", response.id) is None
    assert socket_creates(stack.gateway, "answered") == STEPS + 1
    assert http_posts(stack.gateway) == 0


LANE_TEXT = {lane: " ".join(f"{lane}{i}" for i in range(25)) for lane in ("left", "right")}


async def two_lanes(v1: str) -> dict[str, Any]:
    client = async_client(v1)
    seen: list[str] = []
    finals: dict[str, Any] = {}
    async with client.responses.connect() as connection:
        for lane in ("left", "right"):
            await connection.send(
                {
                    "type": "response.create",
                    "stream_id": lane,
                    "model": "agent-lite",
                    "input": script({"text": LANE_TEXT[lane]}),
                    "store": False,
                }
            )
        while len(finals) < 2:
            event = await arecv(connection)
            seen.append(event.stream_id)
            if event.type == "response.completed":
                finals[event.stream_id] = event.response
        # Each lane goes on from its own answer.
        for lane in ("left", "right"):
            await connection.send(
                {
                    "type": "response.create",
                    "stream_id": lane,
                    "model": "agent-lite",
                    "previous_response_id": finals[lane].id,
                    "input": script({"text": f"{lane} again"}),
                    "store": False,
                }
            )
        second = {}
        for _ in range(2):
            events = await aread_until_done(connection)
            second[events[-1].stream_id] = events[-1].response
    await client.close()
    return {"seen": seen, "first": finals, "second": second}


async def test_two_lanes_interleave_on_one_socket(stack: Stack) -> None:
    result = await trio.to_thread.run_sync(in_asyncio(lambda: two_lanes(stack.v1)))
    seen = result["seen"]
    # Both lanes answered at once: their events alternate, not one lane after the other.
    switches = sum(1 for a, b in itertools.pairwise(seen) if a != b)
    assert switches >= 3, seen
    for lane in ("left", "right"):
        assert result["first"][lane].output_text == LANE_TEXT[lane]
        assert result["second"][lane].output_text == f"{lane} again"
        assert result["second"][lane].previous_response_id == result["first"][lane].id
    bodies = (await stack.sim_stats())["last_request_bodies"][-2:]
    for body in bodies:
        lane = "left" if "left again" in body["messages"][-1]["content"] else "right"
        assert body["messages"][1] == {"role": "assistant", "content": LANE_TEXT[lane]}


def fork(v1: str) -> dict[str, Any]:
    client = sync_client(v1)
    with client.responses.connect() as connection:
        connection.response.create(
            model="agent-lite", input=script({"text": "the root"}), store=False
        )
        root = read_until_done(connection)[-1].response
        for lane, words in (("main", "main branch"), ("fork", "other branch")):
            connection.send(
                {
                    "type": "response.create",
                    "stream_id": lane,
                    "model": "agent-lite",
                    "previous_response_id": root.id,
                    "input": script({"text": words}),
                    "store": False,
                }
            )
        ends = {}
        for _ in range(2):
            done = read_until_done(connection)[-1]
            ends[done.stream_id] = done.response
    return {"root": root, **ends}


async def test_a_fork_continues_a_response_on_a_new_lane(stack: Stack) -> None:
    result = await trio.to_thread.run_sync(fork, stack.v1)
    assert result["main"].output_text == "main branch"
    assert result["fork"].output_text == "other branch"
    assert result["main"].previous_response_id == result["fork"].previous_response_id
    bodies = (await stack.sim_stats())["last_request_bodies"][-2:]
    assert bodies[0]["messages"][:2] == bodies[1]["messages"][:2]
    assert bodies[0]["messages"][1] == {"role": "assistant", "content": "the root"}


async def closed_mid_answer(v1: str) -> int:
    client = async_client(v1)
    deltas = 0
    # websockets stops reading once 16 messages wait unread (its max_queue): a client that
    # stops iterating then closes sends its close frame but reads the gateway's reply only
    # after its close_timeout (10 s), behind the answer the kernel buffered. Unbounded, it
    # reads on to the reply at once.
    options: Any = {"max_queue": None}
    async with client.responses.connect(websocket_connection_options=options) as connection:
        await connection.response.create(model="agent-lite", input=LONG, store=False)
        async for event in connection:
            if event.type == "response.output_text.delta":
                deltas += 1
                if deltas == 3:
                    break
    await client.close()
    return deltas


async def test_a_socket_closed_mid_answer_aborts_the_upstream(stack: Stack) -> None:
    deltas = await trio.to_thread.run_sync(in_asyncio(lambda: closed_mid_answer(stack.v1)))
    assert deltas == 3
    await wait_for_abort(stack.sim)
    await wait_until(
        lambda: (
            stack.gateway.router.metrics.registry.get_sample_value(
                "gateway_cancellations_total", {"cause": "client_gone"}
            )
            == 1.0
        )
    )
