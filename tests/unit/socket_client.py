"""A Responses WebSocket served without a server: the front's ASGI ``receive``/``send`` on
memory channels (what hypercorn would do with a socket), an in-memory upstream, and a clock
the tests move (``autojump_clock``)."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from tests.unit.test_mut_upstream import shell, sse
from trio_gateway.config.schema import (
    AliasConfig,
    ResponsesSocketConfig,
    ServerConfig,
    WebSocketConfig,
)
from trio_gateway.core.usage import UsageRecord
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.http import Scope
from trio_gateway.fronts.responses.socket import ResponsesSocketFront
from trio_gateway.fronts.ws import SocketPlaces

Message = dict[str, Any]


def chunk(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


@attrs.define
class Upstream:
    """Answers each chat request from its last message: ``slow N`` is N one-second chunks,
    anything else one chunk ``ok``. Keeps the bodies it was sent, and how many answers were
    cut (their body closed before its end: the gateway aborted them)."""

    bodies: list[dict[str, Any]] = attrs.field(factory=list)
    cut: int = 0
    _cuts: trio.Event = attrs.field(factory=trio.Event)

    async def wait_cut(self, count: int) -> None:
        """Until ``count`` answers have been cut."""
        while self.cut < count:
            await self._cuts.wait()

    def _one_cut(self) -> None:
        self.cut += 1
        self._cuts.set()
        self._cuts = trio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        words = str(body["messages"][-1]["content"]).split()
        steps = int(words[1]) if len(words) == 2 and words[0] == "slow" else 0

        async def stream() -> AsyncIterator[bytes]:
            done = False
            try:
                for _ in range(steps):
                    yield sse(chunk("t"))
                    await trio.sleep(1)
                last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
                yield sse(chunk("ok"), last, usage, "[DONE]")
                done = True
            finally:
                if not done:
                    self._one_cut()

        return httpx.Response(200, content=stream(), headers={"content-type": "text/event-stream"})


class Records:
    """The usage records, as the ledger would take them."""

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []
        self._offered = trio.Event()

    def offer(self, record: UsageRecord) -> bool:
        self.records.append(record)
        self._offered.set()
        self._offered = trio.Event()
        return True

    async def wait(self, count: int) -> None:
        """Until ``count`` records have been offered."""
        while len(self.records) < count:
            await self._offered.wait()


class Client:
    """The client's side of one socket: what it sends, and what the front sends it."""

    def __init__(self) -> None:
        self._in_send, self._in_receive = trio.open_memory_channel[Message](math.inf)
        self._out_send, self._out_receive = trio.open_memory_channel[Message](math.inf)
        self.closed: Message | None = None

    async def receive(self) -> Message:
        return await self._in_receive.receive()

    async def send(self, message: MutableMapping[str, Any]) -> None:
        await self._out_send.send(dict(message))

    def say(self, message: Any) -> None:
        text = message if isinstance(message, str) else json.dumps(message)
        self._in_send.send_nowait({"type": "websocket.receive", "text": text})

    def create(self, content: str, **fields: Any) -> None:
        self.say({"type": "response.create", "model": "a", "input": content, **fields})

    def leave(self) -> None:
        self._in_send.send_nowait({"type": "websocket.disconnect", "code": 1006})

    async def message(self) -> Message:
        return await self._out_receive.receive()

    async def event(self) -> Message:
        message = await self.message()
        assert message["type"] == "websocket.send", message
        event: Message = json.loads(message["text"])
        return event

    async def until(self, kind: str, stream_id: str | None = None) -> list[Message]:
        """Events up to and including the first of ``kind`` (on that lane, if given)."""
        events = []
        while True:
            event = await self.event()
            events.append(event)
            if event["type"] == kind and (stream_id is None or event.get("stream_id") == stream_id):
                return events

    async def closing(self) -> Message:
        """Events up to the close; the close message."""
        while True:
            message = await self.message()
            if message["type"] == "websocket.close":
                return message


@attrs.define
class Served:
    client: Client
    upstream: Upstream
    router: Router
    records: Records
    front: ResponsesSocketFront


@asynccontextmanager
async def served(**settings: Any) -> AsyncIterator[Served]:
    """One socket, accepted, on a front with these ``[websocket.responses]`` settings."""
    upstream = Upstream()
    provider = shell(upstream, idle_timeout_s=1000.0, first_token_timeout_s=1000.0)
    router = Router({"a": AliasConfig(providers=(provider.config,))}, {provider.name: provider})
    records = Records()
    router.usage = records
    config = WebSocketConfig(responses=ResponsesSocketConfig(**settings))
    ids = iter(range(1_000_000))
    front = ResponsesSocketFront(
        router, ServerConfig(), config, lambda: f"req{next(ids)}", None, SocketPlaces(10)
    )
    client = Client()
    async with trio.open_nursery() as nursery:
        scope: Scope = {"type": "websocket", "path": "/v1/responses", "headers": []}
        nursery.start_soon(front.serve, client.receive, client.send, None, scope)
        client._in_send.send_nowait({"type": "websocket.connect"})
        accepted = await client.message()
        assert accepted["type"] == "websocket.accept"
        yield Served(client, upstream, router, records, front)
        nursery.cancel_scope.cancel()
