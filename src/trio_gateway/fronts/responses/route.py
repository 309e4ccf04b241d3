"""``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``: OpenAI's Responses API
in front of every alias (docs/api.md, "The Responses front").

A body is translated into a chat request (``responses_request.py``) and served on the chat
front's path (``chat.serve_request``: the same routing, admission, gates, budgets, usage
records, with ``endpoint = "responses"``, and cancellation); the answer's events are written
as the Responses stream or ``response`` object (``responses_events.py``). With ``store`` (the
API's default) the response and the conversation up to it are kept for ``previous_response_id``
(``accounting/response_store.py``), under the key that made it.
"""

from __future__ import annotations

import logging
import secrets
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Final

import attrs
import trio

from trio_gateway.accounting.response_store import (
    MemoryResponseStore,
    ResponseStore,
    StoreError,
)
from trio_gateway.config.schema import ResponsesConfig, ServerConfig
from trio_gateway.core.errors import GatewayError, ResponseNotFound, StoreUnavailable
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.request import read_chat_json, validate_chat_body
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
from trio_gateway.fronts.responses.events import ResponseWriter
from trio_gateway.fronts.responses.request import parse_responses_body
from trio_gateway.fronts.responses.seal import Sealer
from trio_gateway.ops.access import current as current_request

log = logging.getLogger("trio_gateway")

FRONT: Final = "responses"
# How long a request naming a response still being written waits for it to be stored: the
# client may send its next turn as soon as it read the last event, before the store has it.
PENDING_WAIT_S: Final = 10.0


class ResponsesService:
    """What the Responses front keeps between requests: the store and the sealing key, and
    the responses of this process still being written."""

    def __init__(self, store: ResponseStore, sealer: Sealer) -> None:
        self.store = store
        self.sealer = sealer
        self._pending: dict[tuple[str, str], trio.Event] = {}

    async def get(self, owner: str, response_id: str) -> dict[str, Any] | None:
        pending = self._pending.get((owner, response_id))
        if pending is not None:
            with trio.move_on_after(PENDING_WAIT_S):
                await pending.wait()
        try:
            return await self.store.get(owner, response_id)
        except StoreError as exc:
            raise StoreUnavailable(str(exc)) from None

    @contextmanager
    def writing(self, owner: str, response_id: str) -> Iterator[None]:
        """While a response is being answered and stored: :meth:`get` waits for it."""
        written = self._pending[(owner, response_id)] = trio.Event()
        try:
            yield
        finally:
            self._pending.pop((owner, response_id), None)
            written.set()

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
        defaults = ResponsesConfig()
        store = MemoryResponseStore(defaults.store_ttl_s, defaults.memory_max_responses)
        service = _SERVICES[router] = ResponsesService(store, Sealer())
    return service


def owner_of(key: ApiKey | None) -> str:
    return key.name if key is not None else ""


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
    body = read_chat_json(raw)
    depth_known = within_depth(raw)
    del raw
    alias = known_alias(router, body)
    context = current_request()
    if context is not None:
        context.alias = alias
    owner = owner_of(key)
    history: list[dict[str, Any]] = []
    previous = body.get("previous_response_id") if isinstance(body, dict) else None
    if isinstance(previous, str):
        record = await service.get(owner, previous)
        if record is None:
            raise ResponseNotFound(
                f"Previous response with id '{previous}' not found.", param="previous_response_id"
            )
        history = record["items"]
    alias_config = router.aliases.get(alias) if alias is not None else None
    parsed = parse_responses_body(
        body,
        history=history,
        opener=service.sealer.open,
        builtin_tools=alias_config.builtin_tools if alias_config is not None else "drop",
    )
    _count_dropped(router, parsed.dropped_fields, parsed.dropped_tools)
    request = for_key(router, validate_chat_body(parsed.chat, depth_known=depth_known), key)
    request = attrs.evolve(request, front=FRONT, dropped_tools=parsed.dropped_tools)
    request = with_session(request, session_id or parsed.session)

    writers: list[ResponseWriter] = []
    # Its own, not the request id's: a client's x-request-id may come twice, a response id not.
    response_id = "resp_" + secrets.token_hex(16)

    def writer(answer_id: str, created: int, *, streaming: bool) -> ResponseWriter:
        made = ResponseWriter(
            response_id=response_id,
            created_at=created,
            model=request.alias,
            echo=parsed.echo,
            summary=parsed.summary,
            tool_names=parsed.tool_names,
            seal=service.sealer.seal,
            streaming=streaming,
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
        headers=dropped_tools_headers(request),
        client_id=response_id,
    )
    stored = False

    async def store() -> None:
        """Keeps the answer, once, if it is one (completed or incomplete)."""
        nonlocal stored
        if stored or not parsed.store or not writers:
            return
        done = writers[-1]
        if done.status not in ("completed", "incomplete"):
            return
        stored = True
        record = {
            "response": done.response(),
            "items": [*history, *parsed.input_items, *done.output],
        }
        with trio.CancelScope(shield=True):
            try:
                await service.store.put(owner, done.id, record)
            except StoreError as exc:
                log.warning("responses: %s not stored: %s", done.id, exc)

    async def send_stored(message: Message) -> None:
        # A whole answer is stored before its body goes out: a client that continues from it
        # at once, on any process, finds it. (A stream's last bytes may go straight to the
        # socket; it is stored right after, and this process's requests wait for it.)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            await store()
        await send(message)

    with service.writing(owner, response_id) if parsed.store else nullcontext():
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
    await send_json(send, 200, record["response"])
