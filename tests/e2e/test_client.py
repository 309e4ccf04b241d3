"""``trio_gateway.client`` against a real gateway and simulator."""

from __future__ import annotations

import contextlib
import random
import re
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket

from tests.e2e.harness import (
    Stack,
    gateway_config,
    provider_toml,
    running_sim,
    script,
    wait_until,
)
from tests.e2e.test_cancellation import LONG, wait_for_abort
from tests.e2e.test_ws import cancellations, ws_stack, ws_url
from trio_gateway.client import (
    Error,
    Event,
    GatewayClosed,
    ProtocolError,
    ReasoningDelta,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
    connect,
)
from trio_gateway.process.serve import GatewayHandle, serve_gateway

TIMEOUT_S = 10
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def user(content: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def text_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_a_stream_yields_the_typed_vocabulary_in_order(stack: Stack) -> None:
    content = script(
        {"reasoning": "need weather"},
        {"text": "Checking"},
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    )
    with trio.fail_after(TIMEOUT_S):
        async with connect(ws_url(stack), api_key="unused") as gw:
            events = [e async for e in gw.stream("agent-lite", user(content), tools=TOOLS)]
    started, *_, usage, done = events
    assert isinstance(started, ResponseStarted)
    assert (started.alias, started.provider, started.seq) == ("agent-lite", "sim-a", 0)
    assert [e.seq for e in events] == list(range(len(events)))
    assert {e.id for e in events} == {"r1"}
    assert {e.request_id for e in events} == {started.request_id}
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "need weather"
    assert text_of(events).strip() == "Checking"
    assert any(isinstance(e, ToolCallDelta) for e in events)
    [call] = [e for e in events if isinstance(e, ToolCallDone)]
    assert (call.name, call.arguments, call.arguments_valid) == (
        "get_weather",
        {"city": "Paris"},
        True,
    )
    assert isinstance(usage, Usage) and usage.reasoning_tokens == 2
    assert isinstance(done, ResponseDone) and done.finish_reason == "tool_calls"


async def test_leaving_the_loop_cancels_that_request_only(stack: Stack) -> None:
    steady_text = "one two three four five six"
    steady = script({"text": "one two three"}, {"delay_s": 0.3}, {"text": " four five six"})
    results: dict[str, list[Event]] = {"long": [], "steady": []}
    with trio.fail_after(TIMEOUT_S):
        async with connect(ws_url(stack)) as gw:

            async def leave_early() -> None:
                async for event in gw.stream("agent-lite", user(LONG)):
                    results["long"].append(event)
                    if sum(isinstance(e, TextDelta) for e in results["long"]) == 3:
                        break

            async def read_all() -> None:
                async for event in gw.stream("agent-lite", user(steady)):
                    results["steady"].append(event)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(leave_early)
                nursery.start_soon(read_all)
            await wait_for_abort(stack.sim)
    assert text_of(results["steady"]) == steady_text
    assert isinstance(results["steady"][-1], ResponseDone)
    stats = stack.sim.engine.stats()
    assert (stats.aborts, stats.finished) == (1, 1)
    await wait_until(lambda: cancellations(stack, "ws_cancel") == 1)


async def test_cancelling_the_scope_cancels_the_request_and_the_socket_goes_on(
    stack: Stack,
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with connect(ws_url(stack)) as gw:
            seen = 0
            stream = gw.stream("agent-lite", user(LONG))
            with trio.CancelScope() as scope:
                async for event in stream:
                    seen += isinstance(event, TextDelta)
                    if seen == 3:
                        scope.cancel()
            assert scope.cancelled_caught
            # Still referenced, so not finalised: the cancel went out when iteration was
            # cancelled.
            await wait_for_abort(stack.sim)
            with pytest.raises(StopAsyncIteration):
                await anext(stream)
            # The same stream, closed explicitly.
            async with gw.stream("agent-lite", user(LONG)) as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        break
            await wait_for_abort(stack.sim, aborts=2)
            answer = [e async for e in gw.stream("agent-lite", user(script({"text": "still"})))]
    assert text_of(answer) == "still"
    await wait_until(lambda: cancellations(stack, "ws_cancel") == 2)


async def test_errors_arrive_as_the_streams_last_event(stack: Stack) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with connect(ws_url(stack)) as gw:
            unknown = [e async for e in gw.stream("no-such-alias", user("hi"))]
            failed = [e async for e in gw.stream("agent-lite", user(script({"status": 503})))]
    [error] = unknown
    assert isinstance(error, Error)
    assert (error.code, error.retryable, error.id) == ("model_not_found", False, "r1")
    [upstream_error] = failed
    assert isinstance(upstream_error, Error)
    assert (upstream_error.code, upstream_error.retryable) == ("upstream_error", True)
    assert upstream_error.provider == "sim-a"


async def test_the_client_answers_the_gateways_pings() -> None:
    settings = "[websocket]\nping_interval_s = 0.05\nping_timeout_s = 0.25"
    async with ws_stack(server=settings) as stack:
        slow = script({"text": "before"}, {"delay_s": 0.8}, {"text": " after"})
        with trio.fail_after(TIMEOUT_S):
            async with connect(ws_url(stack)) as gw:
                events = [e async for e in gw.stream("agent-lite", user(slow))]
    # Several ping timeouts passed during the pause; the socket stayed open.
    assert text_of(events) == "before after"


async def test_a_lost_connection_ends_open_streams_with_gateway_closed() -> None:
    async with running_sim() as sim, trio.open_nursery() as nursery:
        config = gateway_config(provider_toml("sim-a", sim.base_url))
        gateway_scope = trio.CancelScope()

        async def serve(*, task_status: trio.TaskStatus[GatewayHandle]) -> None:
            with gateway_scope:
                await serve_gateway(config, rng=random.Random(0), task_status=task_status)

        gateway: GatewayHandle = await nursery.start(serve)
        url = gateway.base_url.replace("http://", "ws://") + "/v1/ws"
        with trio.fail_after(TIMEOUT_S):
            async with connect(url) as gw:
                stream = gw.stream("agent-lite", user(LONG))
                with pytest.raises(GatewayClosed) as closed:
                    async for event in stream:
                        if isinstance(event, TextDelta):
                            gateway_scope.cancel()  # the gateway goes away mid-answer
                assert closed.value.code == 1006
                with pytest.raises(GatewayClosed):
                    await anext(aiter(gw.stream("agent-lite", user("hi"))))


def documented_example() -> tuple[str, list[str]]:
    """The example of docs/client.md and the output it shows."""
    doc = (Path(__file__).parents[2] / "docs" / "client.md").read_text(encoding="utf-8")
    section = doc.split("## A runnable example", 1)[1]
    (code_lang, code), (_, output) = re.findall(r"```(\w*)\n(.*?)```", section, re.S)[:2]
    assert code_lang == "python"
    return code, output.splitlines()


async def test_the_documented_example_runs_as_written(stack: Stack) -> None:
    code, expected = documented_example()
    assert 'URL = "ws://127.0.0.1:8080/v1/ws"' in code
    code = code.replace("ws://127.0.0.1:8080/v1/ws", ws_url(stack))
    with trio.fail_after(TIMEOUT_S):
        done = await trio.run_process(
            [sys.executable, "-c", code], capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    # The requests run at once: lines of different requests may interleave.
    assert sorted(done.stdout.decode().splitlines()) == sorted(expected)
    await wait_for_abort(stack.sim, aborts=2)
    assert stack.sim.engine.stats().finished == 1


async def test_a_gateway_speaking_nonsense_ends_the_streams_with_protocol_error() -> None:
    async def nonsense(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.get_message()  # the request
        await ws.send_message("<html>not an event</html>")
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            await ws.get_message()

    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            partial(trio_websocket.serve_websocket, nonsense, "127.0.0.1", 0, ssl_context=None)
        )
        url = f"ws://127.0.0.1:{server.port}/v1/ws"
        with trio.fail_after(TIMEOUT_S):
            async with connect(url) as gw:
                stream = gw.stream("agent-lite", user("hi"))
                with pytest.raises(ProtocolError, match="not JSON"):
                    await anext(stream)
                with pytest.raises(ProtocolError):
                    await anext(aiter(gw.stream("agent-lite", user("again"))))
        nursery.cancel_scope.cancel()
