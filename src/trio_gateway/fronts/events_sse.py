"""``POST /v1/events``: the gateway's event vocabulary as server-sent events.

Takes the chat completion body; always streams and always reports usage (``stream`` and
``stream_options`` are ignored). An error before the first event is an HTTP error, exactly as on
``/v1/chat/completions``; after it, an ``error`` event ends the stream.
"""

from __future__ import annotations

import trio

from trio_gateway.config import ServerConfig
from trio_gateway.errors import GatewayError, InternalError
from trio_gateway.fronts.chat import watch_disconnect
from trio_gateway.fronts.events_codec import EventEncoder, is_terminal, sse_frame
from trio_gateway.fronts.http import SSE_HEADERS, Receive, Send, read_body, send_error
from trio_gateway.pipeline import Router
from trio_gateway.relay import Item, Outcome, relay
from trio_gateway.request import parse_chat_request

EVENTS_VERSION_HEADER = (b"x-gateway-events-version", b"1")


async def handle_events(
    router: Router, server: ServerConfig, request_id: str, receive: Receive, send: Send
) -> Outcome:
    body = await read_body(receive, server.max_body_bytes)
    request = parse_chat_request(body)
    plan = router.plan(request)
    encoder = EventEncoder(request_id=request_id, alias=request.alias)
    extra_headers = [(b"x-request-id", request_id.encode())]

    # hypercorn reports a disconnect once the answer's last byte is out, too: not a cancel.
    answered = trio.Event()

    async def watch(scope: trio.CancelScope, outcome: Outcome) -> None:
        await watch_disconnect(receive, scope, outcome, answered)

    async def consume(channel: trio.MemoryReceiveChannel[Item]) -> None:
        try:
            first = await channel.receive()
        except trio.EndOfChannel:
            first = InternalError("the answer ended before it began")
        if isinstance(first, GatewayError):
            answered.set()
            await send_error(send, first, extra_headers)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*SSE_HEADERS, EVENTS_VERSION_HEADER, *extra_headers],
            }
        )
        finished = False

        def render(item: Item) -> bytes:
            nonlocal finished
            finished = finished or is_terminal(item)
            return sse_frame(encoder.encode(item))

        pending = [render(first)]
        ended = False
        while not ended:
            # What is already waiting goes out in one write: fewer syscalls per token.
            while True:
                try:
                    pending.append(render(channel.receive_nowait()))
                except trio.WouldBlock:
                    break
                except trio.EndOfChannel:
                    ended = True
                    break
            if not ended and not pending:
                try:
                    pending.append(render(await channel.receive()))
                except trio.EndOfChannel:
                    ended = True
            if ended and not finished:
                # Only cancellation ends a stream silently, and then this code is not running.
                pending.append(render(InternalError("the answer ended early")))
            if pending:
                data = b"".join(pending)
                pending.clear()
                await send({"type": "http.response.body", "body": data, "more_body": True})
        answered.set()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return await relay(
        request,
        plan,
        buffer_events=server.stream_buffer_events,
        client_stall_timeout_s=server.client_stall_timeout_s,
        consume=consume,
        watch=watch,
    )
