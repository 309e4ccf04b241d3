"""Upstreams misbehaving in ways the simulator does not: a fake upstream per fault."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from tests.e2e.harness import chat, gateway_config, provider_toml, running_gateway

Send = Callable[[dict[str, Any]], Awaitable[None]]
Body = Callable[[Send], Awaitable[None]]

CHUNK = {
    "id": "x",
    "object": "chat.completion.chunk",
    "choices": [{"index": 0, "delta": {"content": "hello"}, "finish_reason": None}],
}
FINISH = {
    "id": "x",
    "object": "chat.completion.chunk",
    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
}


def data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@asynccontextmanager
async def fake_upstream(body: Body) -> AsyncIterator[str]:
    """An upstream that answers every request with 200 text/event-stream and then ``body``."""

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        while (await receive()).get("more_body"):
            pass
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await body(send)

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, app, config)
        yield binds[0]
        nursery.cancel_scope.cancel()


async def ask(upstream: str, **fields: Any) -> httpx.Response:
    config = gateway_config(provider_toml("fake", upstream, api_key_env=None))
    async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=10) as client:
        return await client.post(gateway.base_url + "/v1/chat/completions", json=chat(**fields))


async def linger_after_done(send: Send) -> None:
    """A whole answer, ``[DONE]`` included, and then neither the body's end nor a close."""
    await send({"type": "http.response.body", "body": data(CHUNK), "more_body": True})
    await send({"type": "http.response.body", "body": data(FINISH), "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
    await trio.sleep_forever()


async def test_an_upstream_that_lingers_after_done_does_not_hold_the_client() -> None:
    async with fake_upstream(linger_after_done) as upstream:
        started = trio.current_time()
        response = await ask(upstream, stream=True)
        took = trio.current_time() - started
    assert response.status_code == 200
    assert response.text.rstrip().endswith("data: [DONE]")
    assert '"error"' not in response.text
    assert took < 3  # the 60 s idle timeout did not apply after [DONE]


async def test_a_line_without_end_is_a_protocol_error_not_a_crash() -> None:
    async def endless_line(send: Send) -> None:
        await send({"type": "http.response.body", "body": data(CHUNK), "more_body": True})
        for _ in range(40):
            await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
        await trio.sleep_forever()

    async with fake_upstream(endless_line) as upstream:
        streamed = await ask(upstream, stream=True)
        whole = await ask(upstream)
    error = json.loads(streamed.text.split("data: ")[-2])["error"]
    assert error["code"] == "upstream_protocol_error"
    assert "exceeded" in error["message"]
    assert whole.status_code == 502
    assert whole.json()["error"]["code"] == "upstream_protocol_error"


async def test_an_answer_that_is_json_instead_of_a_stream_is_a_protocol_error() -> None:
    async def not_a_stream(send: Send) -> None:
        body = json.dumps({"id": "x", "object": "chat.completion", "choices": []}).encode()
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async with fake_upstream(not_a_stream) as upstream:
        response = await ask(upstream)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_protocol_error"


async def test_an_event_without_end_is_a_protocol_error_not_a_crash() -> None:
    """``data:`` lines, each short, with no blank line ever: one event that grows without end."""

    async def endless_event(send: Send) -> None:
        await send({"type": "http.response.body", "body": data(CHUNK), "more_body": True})
        line = b"data: " + b"x" * 1000 + b"\n"
        for _ in range(40):
            await send({"type": "http.response.body", "body": line * 64, "more_body": True})
        await trio.sleep_forever()

    async with fake_upstream(endless_event) as upstream:
        streamed = await ask(upstream, stream=True)
        whole = await ask(upstream)
    error = json.loads(streamed.text.split("data: ")[-2])["error"]
    assert error["code"] == "upstream_protocol_error"
    assert "SSE event exceeded" in error["message"]
    assert whole.status_code == 502
    assert whole.json()["error"]["code"] == "upstream_protocol_error"
