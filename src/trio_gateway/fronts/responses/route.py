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
import secrets
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Any, Final

import attrs
import trio

from trio_gateway.accounting.response_records import (
    Record,
    ResponseStore,
    Stored,
    StoreError,
    conversation,
    dumps,
    find_items,
    item_response_id,
)
from trio_gateway.accounting.response_store import chain_bounds, memory_store
from trio_gateway.config.schema import ResponsesConfig, ServerConfig
from trio_gateway.core.errors import (
    GatewayError,
    RequestError,
    ResponseNotFound,
    StoreUnavailable,
)
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.request import ChatRequest, read_chat_json, validate_chat_body
from trio_gateway.core.validation import within_depth
from trio_gateway.dispatch.relay import DropConnection, Outcome
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.auth import with_session
from trio_gateway.fronts.chat import (
    Accumulator,
    Answer,
    Encoder,
    dropped_tools_headers,
    for_key,
    known_alias,
    serve_request,
)
from trio_gateway.fronts.direct import ClientSocket
from trio_gateway.fronts.http import Message, Receive, Send, read_body, send_json
from trio_gateway.fronts.off_loop import OFF_LOOP_BODY_BYTES, off_loop
from trio_gateway.fronts.responses.events import ResponseWriter
from trio_gateway.fronts.responses.items import Item, item_not_found, references
from trio_gateway.fronts.responses.request import ResponsesRequest, parse_responses_body
from trio_gateway.fronts.responses.seal import Sealer
from trio_gateway.ops.access import current as current_request

log = logging.getLogger("trio_gateway")

FRONT: Final = "responses"
# Where its messages and their parts are (core/body.py bounds them): the input items, and
# the content of each.
RESPONSES_PARTS: Final = (("input",), ("input", "*", "content"))
# How long a request naming a response still being written waits for it to be stored: the
# client may send its next turn as soon as it read the last event, before the store has it.
PENDING_WAIT_S: Final = 10.0
# Said when a response asked to be stored is not: past [responses] max_record_bytes, or the
# store failed. On a stream, known only at its end: there the last event's response says
# "store": false instead.
STORED_HEADER: Final = b"x-gateway-response-stored"
TOO_LARGE: Final = b"false; reason=record_too_large"
STORE_FAILED: Final = b"false; reason=store_unavailable"


class ResponsesService:
    """What the Responses front keeps between requests: the store, its bounds and the sealing
    key, and the responses of this process still being written."""

    def __init__(self, store: ResponseStore, sealer: Sealer, settings: ResponsesConfig) -> None:
        self.store = store
        self.sealer = sealer
        self.bounds = chain_bounds(settings)
        self.max_record_bytes = settings.max_record_bytes
        self._pending: dict[tuple[str, str], trio.Event] = {}

    def stores(self, local: Sequence[ResponseStore]) -> list[ResponseStore]:
        """Where a response is looked for: ``local`` first (a WebSocket's own), then the store."""
        return [*local, self.store]

    async def _written(self, owner: str, response_id: str) -> None:
        pending = self._pending.get((owner, response_id))
        if pending is not None:
            with trio.move_on_after(PENDING_WAIT_S):
                await pending.wait()

    async def get(self, owner: str, response_id: str) -> Record | None:
        await self._written(owner, response_id)
        try:
            return await self.store.get(owner, response_id)
        except StoreError as exc:
            raise StoreUnavailable(str(exc)) from None

    async def conversation(
        self, owner: str, response_id: str, local: Sequence[ResponseStore] = ()
    ) -> list[Record]:
        """The turns up to ``response_id``, oldest first (``previous_response_id``)."""
        await self._written(owner, response_id)
        try:
            return await conversation(self.stores(local), owner, response_id, self.bounds)
        except StoreError as exc:
            raise StoreUnavailable(str(exc)) from None

    async def referenced(
        self, owner: str, item_ids: Sequence[str], local: Sequence[ResponseStore] = ()
    ) -> dict[str, Item]:
        """The items ``item_reference`` items name, by id; an id none of the owner's responses
        holds is refused, as the API refuses it."""
        for response_id in {item_response_id(one) for one in item_ids} - {None}:
            assert response_id is not None
            await self._written(owner, response_id)
        try:
            found = await find_items(self.stores(local), owner, item_ids, self.bounds)
        except StoreError as exc:
            raise StoreUnavailable(str(exc)) from None
        for item_id in item_ids:
            if item_id not in found:
                raise item_not_found(item_id)
        return found

    @contextmanager
    def writing(self, owner: str, response_id: str) -> Iterator[None]:
        """While a response is being answered and stored: a lookup of it waits for it."""
        written = self._pending[(owner, response_id)] = trio.Event()
        try:
            yield
        finally:
            self._pending.pop((owner, response_id), None)
            written.set()

    async def put(self, owner: str, stored: Stored) -> bool:
        """Keeps a record; False (logged) when the store failed."""
        try:
            await self.store.put(owner, stored)
        except StoreError as exc:
            log.warning("responses: %s not stored: %s", stored.id, exc)
            return False
        return True

    async def delete(self, owner: str, response_id: str) -> bool:
        try:
            return await self.store.delete(owner, response_id)
        except StoreError as exc:
            raise StoreUnavailable(str(exc)) from None


_SERVICES: weakref.WeakKeyDictionary[Router, ResponsesService] = weakref.WeakKeyDictionary()


def attach_responses(router: Router, service: ResponsesService) -> None:
    """The service the front uses for this router's requests (``process/serve.py``)."""
    _SERVICES[router] = service


def service_of(router: Router) -> ResponsesService:
    """The router's service; a gateway started without one (an app made in a test) keeps its
    responses in memory."""
    service = _SERVICES.get(router)
    if service is None:
        settings = ResponsesConfig()
        service = _SERVICES[router] = ResponsesService(memory_store(settings), Sealer(), settings)
    return service


def owner_of(key: ApiKey | None) -> str:
    return key.name if key is not None else ""


def _validated(parsed: ResponsesRequest, depth_known: bool) -> ChatRequest:
    """The translated body through chat's validation; a refusal names the field the client
    sent (the chat body's names are the gateway's own)."""
    try:
        return validate_chat_body(parsed.chat, depth_known=depth_known)
    except RequestError as exc:
        if exc.param is not None:
            client = parsed.client_param(exc.param)
            exc.message = exc.message.replace(f"'{exc.param}'", f"'{client}'")
            exc.args = (exc.message,)
            exc.param = client
        raise


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
    alias = known_alias(router, body)
    context = current_request()
    if context is not None:
        context.alias = alias
    owner = owner_of(key)
    history: list[Item] = []
    previous = body.get("previous_response_id") if isinstance(body, dict) else None
    if isinstance(previous, str):
        for turn in await service.conversation(owner, previous):
            history += turn.items()
    wanted = references(body.get("input") if isinstance(body, dict) else None)
    referenced = await service.referenced(owner, wanted) if wanted else {}
    alias_config = router.aliases.get(alias) if alias is not None else None

    def translate(
        history: list[Item], referenced: dict[str, Item]
    ) -> tuple[ResponsesRequest, ChatRequest]:
        parsed = parse_responses_body(
            body,
            history=history,
            referenced=referenced,
            opener=service.sealer.open,
            builtin_tools=alias_config.builtin_tools if alias_config is not None else "drop",
        )
        _count_dropped(router, parsed.dropped_fields, parsed.dropped_tools)
        request = for_key(router, _validated(parsed, depth_known), key)
        request = attrs.evolve(request, front=FRONT, dropped_tools=parsed.dropped_tools)
        request = with_session(request, session_id or parsed.session)
        router.screen(request)
        return parsed, request

    # A stored conversation's size is not known without measuring it: read with one, as with
    # a big body, off the loop.
    many = OFF_LOOP_BODY_BYTES + 1 if history or referenced else size
    parsed, request = await off_loop(many, partial(translate, history, referenced))
    del history, referenced

    # Its own, not the request id's: a client's x-request-id may come twice, a response id not.
    response_id = "resp_" + secrets.token_hex(16)
    headers = dropped_tools_headers(request)
    echo = parsed.echo
    # The record's size but for its response: the input is measured once.
    without_response = turn_record(response_id, parsed, {}).size - len(dumps({}))
    if parsed.store and without_response > service.max_record_bytes:
        # Too large before a word is written: said in the headers, streamed or not.
        echo = {**echo, "store": False}
        headers.append((STORED_HEADER, TOO_LARGE))
    keeping = bool(echo["store"])
    writers: list[ResponseWriter] = []
    not_stored: bytes | None = None

    def fits(response: dict[str, Any]) -> bool:
        """The final response, before it is written: whether its record is within bounds."""
        size = without_response + len(dumps(response).encode())
        return size <= service.max_record_bytes

    def writer(answer_id: str, created: int, *, streaming: bool) -> ResponseWriter:
        made = ResponseWriter(
            response_id=response_id,
            created_at=created,
            model=request.alias,
            echo=echo,
            summary=parsed.summary,
            tool_names=parsed.tool_names,
            seal=service.sealer.seal,
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
        client_id=response_id,
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
        record = turn_record(response_id, parsed, done.response())
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

    with service.writing(owner, response_id) if keeping else nullcontext():
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


def turn_record(response_id: str, parsed: ResponsesRequest, response: dict[str, Any]) -> Stored:
    """The turn as the store keeps it: its input items and its response, and the response it
    continued."""
    record = Record(
        id=response_id,
        previous=parsed.previous_response_id,
        response=response,
        input=parsed.input_items,
    )
    return Stored.of(record)


def _count_dropped(router: Router, fields: tuple[str, ...], tools: tuple[str, ...]) -> None:
    metric = router.metrics.front_dropped_fields
    for field in fields:
        log.debug("responses: dropped the field %r", field)
        metric.labels(FRONT, field).inc()
    for tool in tools:
        log.debug("responses: dropped the built-in tool %r", tool)
        metric.labels(FRONT, f"tool:{tool}").inc()


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
