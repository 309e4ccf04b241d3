"""``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``: OpenAI's Responses API
in front of every alias (docs/api.md, "The Responses front").

A body is translated into a chat request (``request.py``, ``items.py``) and served on the chat
front's path (``chat.serve_request``: the same routing, admission, gates, budgets, usage
records, with ``endpoint = "responses"``, and cancellation); the answer's events are written
as the Responses stream or ``response`` object (``events.py``). With ``store`` (the API's
default) the turn is kept (``accounting/response_records.py``: its own items and the response
it continued, never the conversation again), under the key that made it, for a later
``previous_response_id`` or ``item_reference``.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from functools import partial
from typing import Any, Final

import trio

from trio_gateway.config.schema import ServerConfig
from trio_gateway.core.errors import GatewayError, ResponseNotFound
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.request import read_chat_json
from trio_gateway.core.validation import within_depth
from trio_gateway.dispatch.relay import DropConnection, Outcome
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.chat import (
    Accumulator,
    Answer,
    Encoder,
    dropped_tools_headers,
    serve_request,
)
from trio_gateway.fronts.direct import ClientSocket
from trio_gateway.fronts.http import Message, Receive, Send, read_body, send_json
from trio_gateway.fronts.off_loop import off_loop
from trio_gateway.fronts.responses.events import ResponseWriter
from trio_gateway.fronts.responses.request import RESPONSES_PARTS, ResponsesRequest
from trio_gateway.fronts.responses.service import (
    PENDING_WAIT_S,
    ResponsesService,
    attach_responses,
    owner_of,
    service_of,
)
from trio_gateway.fronts.responses.turn import prepare_turn, turn_record

__all__ = [
    "PENDING_WAIT_S",
    "ResponsesService",
    "attach_responses",
    "handle_responses",
    "handle_stored",
    "service_of",
    "turn_record",
]

log = logging.getLogger("trio_gateway")

FRONT: Final = "responses"
# Said when a response asked to be stored is not: past [responses] max_record_bytes, or the
# store failed. On a stream, known only at its end: there the last event's response says
# "store": false instead.
STORED_HEADER: Final = b"x-gateway-response-stored"
TOO_LARGE: Final = b"false; reason=record_too_large"
STORE_FAILED: Final = b"false; reason=store_unavailable"


async def handle_responses(
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
    service = service_of(router)
    raw = await read_body(receive, server.max_body_bytes)
    size = len(raw)
    body, depth_known = await off_loop(size, partial(_read, raw))
    del raw
    turn = await prepare_turn(
        router,
        service,
        body,
        key,
        front=FRONT,
        size=size,
        depth_known=depth_known,
        session_id=session_id,
        count_dropped=partial(count_dropped, router, FRONT),
    )
    parsed, request, owner = turn.parsed, turn.request, turn.owner
    headers = dropped_tools_headers(request)
    echo = parsed.echo
    if parsed.store and turn.base_size > service.max_record_bytes:
        # Too large before a word is written: said in the headers, streamed or not.
        echo = {**echo, "store": False}
        headers.append((STORED_HEADER, TOO_LARGE))
    keeping = bool(echo["store"])
    writers: list[ResponseWriter] = []
    not_stored: bytes | None = None

    def fits(response: dict[str, Any]) -> bool:
        """The final response, before it is written: whether its record is within bounds."""
        return turn.fits(response, service.max_record_bytes)

    def writer(answer_id: str, created: int, *, streaming: bool) -> ResponseWriter:
        made = turn.writer(
            service,
            created_at=created,
            echo=echo,
            streaming=streaming,
            keep=fits if keeping else None,
        )
        writers.append(made)
        return made

    def stream(answer_id: str, created: int) -> Encoder:
        return writer(answer_id, created, streaming=True)

    def whole(answer_id: str, created: int) -> Accumulator:
        return writer(answer_id, created, streaming=False)

    def stream_error(error: GatewayError) -> bytes:
        return writers[-1].fail(error) if writers else b""

    answer = Answer(
        id_prefix="resp",
        whole=whole,
        stream=stream,
        stream_error=stream_error,
        headers=headers,
        client_id=turn.response_id,
    )
    stored = False

    async def store() -> None:
        """Keeps the answer, once, if it is one (completed or incomplete) that fits."""
        nonlocal stored, not_stored
        if stored or not keeping or not writers:
            return
        done = writers[-1]
        if done.status not in ("completed", "incomplete"):
            return
        stored = True
        record = turn.record(done.response())
        if record.size > service.max_record_bytes:
            not_stored = TOO_LARGE
            return
        with trio.CancelScope(shield=True):
            if not await service.put(owner, record):
                not_stored = STORE_FAILED

    async def send_stored(message: Message) -> None:
        # A whole answer is stored before it goes out, so its headers can say how that went,
        # and a client that continues from it at once, on any process, finds it. (A stream's
        # last bytes may go straight to the socket; it is stored right after, and this
        # process's requests wait for it.)
        if message["type"] == "http.response.start" and not parsed.stream:
            await store()
            if not_stored is not None:
                message = {**message, "headers": [*message["headers"], (STORED_HEADER, not_stored)]}
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            await store()
        await send(message)

    with service.writing(owner, turn.response_id) if keeping else nullcontext():
        outcome = await serve_request(
            router,
            server,
            request,
            answer,
            request_id,
            receive,
            send_stored,
            drop_connection,
            key,
            client,
        )
        await store()
        return outcome


def count_dropped(router: Router, front: str, parsed: ResponsesRequest) -> None:
    """The fields and built-in tools a turn's body had that the front does not use."""
    metric = router.metrics.front_dropped_fields
    for field in parsed.dropped_fields:
        log.debug("%s: dropped the field %r", front, field)
        metric.labels(front, field).inc()
    for tool in parsed.dropped_tools:
        log.debug("%s: dropped the built-in tool %r", front, tool)
        metric.labels(front, f"tool:{tool}").inc()


async def handle_stored(
    router: Router, method: str, response_id: str, key: ApiKey | None, send: Send
) -> None:
    """``GET /v1/responses/{id}`` (the response) and ``DELETE`` (gone, as the API says it)."""
    service = service_of(router)
    owner = owner_of(key)
    if method == "DELETE":
        if not await service.delete(owner, response_id):
            raise ResponseNotFound(f"Response with id '{response_id}' not found.")
        await send_json(send, 200, {"id": response_id, "object": "response", "deleted": True})
        return
    record = await service.get(owner, response_id)
    if record is None:
        raise ResponseNotFound(f"Response with id '{response_id}' not found.")
    await send_json(send, 200, record.response)


def _read(raw: bytes) -> tuple[Any, bool]:
    """The body as JSON (its parts bounded), and whether its nesting is known to be within
    validation's bound."""
    return read_chat_json(raw, RESPONSES_PARTS), within_depth(raw)
