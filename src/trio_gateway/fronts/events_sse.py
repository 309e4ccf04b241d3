"""``POST /v1/events``: the gateway's event vocabulary as server-sent events.

Takes the chat completion body, validated like any; always streams and always reports usage
(``stream`` and ``stream_options`` change nothing). An error before the first event is an HTTP
error, exactly as on ``/v1/chat/completions``; after it, an ``error`` event ends the stream.
"""

from __future__ import annotations

import trio

from trio_gateway.config.schema import ServerConfig
from trio_gateway.core.errors import InternalError
from trio_gateway.core.events_codec import EventEncoder, is_terminal, sse_frame
from trio_gateway.core.keys import ApiKey
from trio_gateway.dispatch.relay import DropConnection, Item, Outcome, relay
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.auth import with_session
from trio_gateway.fronts.chat import client_watch, read_chat_request, read_screened
from trio_gateway.fronts.direct import ClientSocket
from trio_gateway.fronts.http import Receive, Send, SSEAnswer, read_body

EVENTS_VERSION_HEADER = (b"x-gateway-events-version", b"1")


async def handle_events(
    router: Router,
    server: ServerConfig,
    request_id: str,
    receive: Receive,
    send: Send,
    drop_connection: DropConnection | None = None,
    key: ApiKey | None = None,
    client: ClientSocket | None = None,
    session_id: str | None = None,
) -> Outcome:
    # The raw bytes are not kept in this frame: it lasts as long as the answer streams.
    raw = await read_body(receive, server.max_body_bytes)
    request = await read_screened(
        router, raw, lambda raw: with_session(read_chat_request(router, raw, key), session_id)
    )
    del raw
    plan = router.plan(request)
    admission = await router.admit(key, request, plan)
    encoder = EventEncoder(request_id=request_id, alias=request.alias)
    extra_headers = [(b"x-request-id", request_id.encode())]
    if admission is not None:
        extra_headers += admission.headers

    # hypercorn reports a disconnect once the answer's last byte is out, too: not a cancel.
    answered = trio.Event()
    watchers, hang_up = client_watch(receive, client, answered)
    finished = False

    def render(item: Item) -> bytes:
        nonlocal finished
        finished = finished or is_terminal(item)
        return sse_frame(encoder.encode(item))

    def closing() -> bytes:
        # Only cancellation ends a stream silently, and then this code is not running.
        return b"" if finished else render(InternalError("the answer ended early"))

    sink = SSEAnswer(
        send,
        render=render,
        headers=extra_headers,
        answered=answered,
        stall_timeout_s=server.client_stall_timeout_s,
        client=client,
        drop=drop_connection,
        closing=closing,
        extra_sse_headers=[EVENTS_VERSION_HEADER],
    )
    if client is None:
        watchers.append(sink.watchdog)  # hypercorn's writes: no deadline of their own
    return await relay(
        request,
        plan,
        sink=sink,
        client_stall_timeout_s=server.client_stall_timeout_s,
        watch=watchers,
        hang_up=hang_up,
        drop_connection=drop_connection,
        request_id=request_id,
        admission=admission,
    )
