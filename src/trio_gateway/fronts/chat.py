"""``POST /v1/chat/completions``: the OpenAI-compatible front."""

from __future__ import annotations

import time

import trio

from trio_gateway.auth import ApiKey
from trio_gateway.config import ServerConfig
from trio_gateway.errors import GatewayError, InternalError
from trio_gateway.fronts.auth import authorize, with_session
from trio_gateway.fronts.http import (
    Receive,
    Send,
    read_body,
    send_error,
    send_json,
    stream_sse,
)
from trio_gateway.fronts.openai_chunks import ChunkEncoder, ResponseAccumulator, error_chunk
from trio_gateway.pipeline import Router
from trio_gateway.relay import CLIENT_GONE, ClientWritable, DropConnection, Item, Outcome, relay
from trio_gateway.request import parse_chat_request
from trio_gateway.sse import DONE


async def watch_disconnect(
    receive: Receive, scope: trio.CancelScope, outcome: Outcome, answered: trio.Event
) -> None:
    """hypercorn never cancels the app when a client leaves (and ``send`` keeps succeeding), so
    the only sign is ``http.disconnect`` from ``receive``. hypercorn also reports it once the
    last byte of an answer is out: ``answered`` tells the two apart."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not answered.is_set():
                outcome.cancelled = outcome.cancelled or CLIENT_GONE
                scope.cancel(reason=CLIENT_GONE)
            return


async def handle_chat(
    router: Router,
    server: ServerConfig,
    request_id: str,
    receive: Receive,
    send: Send,
    drop_connection: DropConnection | None = None,
    key: ApiKey | None = None,
    client_writable: ClientWritable | None = None,
    session_id: str | None = None,
) -> Outcome:
    body = await read_body(receive, server.max_body_bytes)
    request = with_session(authorize(parse_chat_request(body), key), session_id)
    plan = router.plan(request)
    admission = await router.limits.admit(
        key, request.body, tuple(u.config for u in plan.upstreams)
    )
    completion_id = f"chatcmpl-{request_id}"
    created = int(time.time())
    extra_headers = [(b"x-request-id", request_id.encode())]
    if admission is not None:
        extra_headers += admission.headers

    answered = trio.Event()

    async def watch(scope: trio.CancelScope, outcome: Outcome) -> None:
        await watch_disconnect(receive, scope, outcome, answered)

    if request.stream:
        encoder = ChunkEncoder(
            completion_id=completion_id,
            created=created,
            model=request.alias,
            include_usage=request.include_usage,
        )

        def render(item: Item) -> bytes:
            if isinstance(item, GatewayError):
                return error_chunk(item) + DONE
            return encoder.encode(item)

        async def consume_stream(channel: trio.MemoryReceiveChannel[Item]) -> None:
            await stream_sse(channel, send, render=render, headers=extra_headers, answered=answered)

        return await relay(
            request,
            plan,
            buffer_events=server.stream_buffer_events,
            client_stall_timeout_s=server.client_stall_timeout_s,
            consume=consume_stream,
            watch=watch,
            drop_connection=drop_connection,
            client_writable=client_writable,
            request_id=request_id,
            admission=admission,
        )

    accumulator = ResponseAccumulator(
        completion_id=completion_id, created=created, model=request.alias
    )

    async def consume_whole(channel: trio.MemoryReceiveChannel[Item]) -> None:
        async for item in channel:
            if isinstance(item, GatewayError):
                answered.set()
                await send_error(send, item, extra_headers)
                return
            accumulator.add(item)
        answered.set()
        if accumulator.finish_reason is None:
            # The producer ended without an answer or an error: only cancellation does that.
            await send_error(send, InternalError("the answer ended early"), extra_headers)
            return
        await send_json(send, 200, accumulator.result(), extra_headers)

    return await relay(
        request,
        plan,
        buffer_events=server.stream_buffer_events,
        client_stall_timeout_s=server.client_stall_timeout_s,
        consume=consume_whole,
        watch=watch,
        drop_connection=drop_connection,
        client_writable=client_writable,
        request_id=request_id,
        admission=admission,
    )
