"""One turn of the Responses front, from its body to its record: what ``POST /v1/responses``
(``route.py``) and a WebSocket's ``response.create`` (``socket_turn.py``) share.

:func:`prepare_turn` reads the conversation a ``previous_response_id`` continues and the items
``item_reference`` items name (from the socket's own recent responses first, when there is a
socket, then the store), translates the body into a chat request (``request.py``), validates it
as any chat request, and names it after its key, at its priority, in its session. The turn
then has its response id, and knows its record's size but for the response: the input is
measured once, whatever the answer.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import attrs

from trio_gateway.accounting.response_records import Record, ResponseStore, Stored, dumps
from trio_gateway.core.errors import RequestError
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.request import ChatRequest, validate_chat_body
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.auth import with_session
from trio_gateway.fronts.chat import for_key, known_alias
from trio_gateway.fronts.off_loop import OFF_LOOP_BODY_BYTES, off_loop
from trio_gateway.fronts.responses.events import Frame, Keep, ResponseWriter
from trio_gateway.fronts.responses.items import Item, Prefix, references
from trio_gateway.fronts.responses.prefixes import Prefixes
from trio_gateway.fronts.responses.request import ResponsesRequest, parse_responses_body
from trio_gateway.fronts.responses.service import ResponsesService, owner_of
from trio_gateway.ops.access import current as current_request


@attrs.frozen(kw_only=True)
class Turn:
    """A turn ready to be routed: the body as the front read it, the chat request it became,
    and the id its response will have."""

    parsed: ResponsesRequest
    request: ChatRequest
    response_id: str
    owner: str  # whose responses it may continue, and under whom it is kept
    # The record's size but for its response (:meth:`fits` adds the response alone).
    base_size: int
    # The conversation it continued: its records and their stored bytes (none: 0, 0).
    history_turns: int = 0
    history_bytes: int = 0

    def record(self, response: dict[str, Any]) -> Stored:
        """The turn as a store keeps it: its input items, its response, the response it
        continued."""
        return turn_record(self.response_id, self.parsed, response)

    def fits(self, response: Mapping[str, Any], max_bytes: int) -> bool:
        """Whether the record with ``response`` holds at most ``max_bytes``."""
        return self.base_size + len(dumps(response).encode()) <= max_bytes

    def writer(
        self,
        service: ResponsesService,
        *,
        created_at: int,
        echo: Mapping[str, Any],
        streaming: bool,
        keep: Keep | None = None,
        frame: Frame | None = None,
    ) -> ResponseWriter:
        """The turn's answer as the Responses API writes it."""
        return ResponseWriter(
            response_id=self.response_id,
            created_at=created_at,
            model=self.request.alias,
            echo=echo,
            summary=self.parsed.summary,
            tool_names=self.parsed.tool_names,
            seal=service.sealer.seal,
            seal_always=self.parsed.sealed_reasoning,
            streaming=streaming,
            keep=keep,
            frame=frame,
        )


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


async def prepare_turn(
    router: Router,
    service: ResponsesService,
    body: object,
    key: ApiKey | None,
    *,
    front: str,
    size: int,
    depth_known: bool,
    local: Sequence[ResponseStore] = (),
    session_id: str | None = None,
    count_dropped: Callable[[ResponsesRequest], None] = lambda parsed: None,
    prefixes: Prefixes | None = None,
) -> Turn:
    """``body`` (decoded JSON) as a turn, or the ``RequestError`` the API would answer. The
    alias it names goes into the request's context first, so a refusal is recorded under it.
    ``local``: stores looked in before the service's (a WebSocket's own responses). ``size``:
    the body's bytes; a big body, or a conversation read back, is translated, validated and
    screened by the input filters off the event loop (``fronts/off_loop.py``). ``prefixes``:
    the conversations ``local`` holds, as already read (``prefixes.py``); the turn's history as
    read is kept in its ``parsed.history``, for its own."""
    alias = known_alias(router, body)
    context = current_request()
    if context is not None:
        context.alias = alias
    owner = owner_of(key)
    fields: Mapping[str, Any] = body if isinstance(body, dict) else {}
    history: list[Item] = []
    history_turns = history_bytes = 0
    prefix: Prefix | None = None
    previous = fields.get("previous_response_id")
    if isinstance(previous, str):
        found = prefixes.get(owner, previous, service.bounds) if prefixes is not None else None
        if found is not None:
            prefix, history_turns, history_bytes = found
        else:
            turns, history_bytes = await service.conversation(owner, previous, local)
            history_turns = len(turns)
            for turn in turns:
                history += turn.items()
    wanted = references(fields.get("input"))
    referenced = await service.referenced(owner, wanted, local) if wanted else {}
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
            prefix=prefix,
            snapshot=prefixes is not None,
        )
        count_dropped(parsed)
        request = for_key(router, _validated(parsed, depth_known), key)
        request = attrs.evolve(request, front=front, dropped_tools=parsed.dropped_tools)
        request = with_session(request, session_id or parsed.session)
        router.screen(request)
        return parsed, request

    # A conversation read back weighs what its records do (their stored bytes, known to the
    # walk): a body of that size would be translated off the loop past OFF_LOOP_BODY_BYTES,
    # and so is it. Referenced items are not measured (rare; that would cost what translating
    # them does): off the loop.
    many = OFF_LOOP_BODY_BYTES + 1 if referenced else size + history_bytes
    parsed, request = await off_loop(many, partial(translate, history, referenced))
    del history, referenced
    # Its own, not the request id's: a client's x-request-id may come twice, a response id not.
    response_id = "resp_" + secrets.token_hex(16)
    base_size = turn_record(response_id, parsed, {}).size - len(dumps({}))
    return Turn(
        parsed=parsed,
        request=request,
        response_id=response_id,
        owner=owner,
        base_size=base_size,
        history_turns=history_turns,
        history_bytes=history_bytes,
    )


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
