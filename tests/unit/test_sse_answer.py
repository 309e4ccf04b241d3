"""SSEAnswer, the SSE fronts' sink: what it sends through hypercorn's ``send`` and what it writes
to the socket itself, and the watchdog that drops a client whose hypercorn write never returns."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from tests.unit.test_relay import bursts, router
from tests.unit.test_relay import run as run_relay
from trio_gateway.core.errors import InternalError, UpstreamTimeout
from trio_gateway.core.events import ResponseDone, TextDelta
from trio_gateway.dispatch.relay import CLIENT_STALL, ClientLeft, Item
from trio_gateway.fronts.direct import ClientSocket
from trio_gateway.fronts.http import Message, SSEAnswer


def render(item: Item) -> bytes:
    if isinstance(item, TextDelta):
        return f"data: {item.text}\n\n".encode()
    if isinstance(item, ResponseDone):
        return b"data: done\n\n"
    if isinstance(item, InternalError | UpstreamTimeout):
        return b"data: error\n\n"
    return b""


class Sent:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


def answer(send: Any, **kwargs: Any) -> tuple[SSEAnswer, trio.Event]:
    answered = trio.Event()
    sink = SSEAnswer(
        send,
        render=render,
        headers=[(b"x-request-id", b"r1")],
        answered=answered,
        stall_timeout_s=1.0,
        closing=lambda: b": bye\n\n",
        **kwargs,
    )
    return sink, answered


async def test_through_hypercorn_the_head_then_each_batch_then_the_end() -> None:
    sent = Sent()
    sink, answered = answer(sent)
    await sink.put([TextDelta("a"), TextDelta("b")])
    assert not answered.is_set()
    # The last event handed over: a client that closes now has its whole answer.
    await sink.put([ResponseDone("stop")])
    assert answered.is_set()
    await sink.end()
    start, *bodies = sent.messages
    assert start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert (b"x-request-id", b"r1") in start["headers"]
    assert [m["body"] for m in bodies] == [
        b"data: a\n\ndata: b\n\n",
        b"data: done\n\n",
        b": bye\n\n",
    ]
    assert [m["more_body"] for m in bodies] == [True, True, False]


async def test_an_error_first_is_an_http_error_and_nothing_else() -> None:
    sent = Sent()
    sink, answered = answer(sent)
    await sink.put([UpstreamTimeout("p1: no first token", provider="p1")])
    await sink.end()
    assert answered.is_set()
    start, body = sent.messages
    assert start["status"] == 504
    assert b"upstream_timeout" in body["body"]
    assert len(sent.messages) == 2


async def test_an_answer_that_never_began_ends_as_an_internal_error() -> None:
    sent = Sent()
    sink, _ = answer(sent)
    await sink.end()
    assert sent.messages[0]["status"] == 500
    assert b"the answer ended before it began" in sent.messages[1]["body"]


@asynccontextmanager
async def direct_answer() -> AsyncIterator[tuple[socket.socket, SSEAnswer, trio.Event, Sent]]:
    """An answer written to a real connection: (its client's end, the sink, answered, what went
    through ``send``)."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listener:
        client = socket.create_connection(listener.socket.getsockname())
        server = await listener.accept()
        async with server:
            sent = Sent()
            sink, answered = answer(sent, client=ClientSocket(server.socket, chunked=True))
            with client:
                yield client, sink, answered, sent


async def test_direct_writes_carry_the_same_body_as_chunks_and_hypercorn_writes_the_end() -> None:
    async with direct_answer() as (client, sink, answered, sent):
        await sink.put([TextDelta("a"), TextDelta("b")])
        await sink.put([ResponseDone("stop")])
        await sink.end()
        wire = b""
        client.setblocking(False)
        with trio.move_on_after(1):
            while len(wire) < 55:
                try:
                    wire += client.recv(4096)
                except BlockingIOError:
                    await trio.sleep(0.01)
    # Only the head and the end went through hypercorn; the body went to the socket, framed.
    start, end = sent.messages
    assert start["type"] == "http.response.start"
    assert end == {"type": "http.response.body", "body": b"", "more_body": False}
    assert wire == b"".join(
        b"%x\r\n%b\r\n" % (len(data), data)
        for data in (b"data: a\n\ndata: b\n\n", b"data: done\n\n", b": bye\n\n")
    )
    assert answered.is_set()


async def test_a_client_that_closes_once_it_has_the_last_event_ends_it_cleanly() -> None:
    """The sync openai SDK closes on ``[DONE]``: the rest (the closing, the last chunk) finds
    the connection reset, which is then no ``ClientLeft``; before the last event it is."""
    for last in (True, False):
        async with direct_answer() as (client, sink, answered, sent):
            await sink.put([TextDelta("a")])
            if last:
                await sink.put([ResponseDone("stop")])
            # Unread bytes in its buffer: the close is a reset, the next write fails.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            client.close()
            try:
                await sink.end()
            except ClientLeft:
                assert not last
            else:
                assert last
            assert answered.is_set() == last
            assert len(sent.messages) == 1  # the end of the body was not sent


async def test_the_watchdog_drops_a_client_whose_hypercorn_write_never_returns(
    autojump_clock: trio.abc.Clock,
) -> None:
    writes = 0

    async def send(message: Message) -> None:
        nonlocal writes
        if message["type"] == "http.response.body":
            writes += 1
            if writes == 3:
                await trio.sleep_forever()  # the client stopped reading: blocked for good

    drops: list[int] = []
    sink, _ = answer(send, drop=lambda: drops.append(1))
    started = trio.current_time()
    outcome = await run_relay(router(bursts), sink, stall_s=1.0, watch=[sink.watchdog])
    assert outcome.cancelled == CLIENT_STALL
    assert drops == [1]
    # Checked once a period: dropped within two of the write that blocked.
    assert 1.0 <= trio.current_time() - started <= 2.0
