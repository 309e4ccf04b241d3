"""What the Responses front keeps between requests (``ResponsesService``): the store of
responses, its bounds, the sealing key, and the responses of this process still being written;
one per router (``attach_responses``, at start)."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Final

import trio

from trio_gateway.accounting.response_records import (
    Record,
    ResponseStore,
    Stored,
    StoreError,
    find_items,
    item_response_id,
    sized_conversation,
)
from trio_gateway.accounting.response_store import chain_bounds, memory_store
from trio_gateway.config.schema import ResponsesConfig
from trio_gateway.core.errors import StoreUnavailable
from trio_gateway.core.keys import ApiKey
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.responses.items import Item, item_not_found
from trio_gateway.fronts.responses.seal import Sealer

log = logging.getLogger("trio_gateway")

# How long a request naming a response still being written waits for it to be stored: the
# client may send its next turn as soon as it read the last event, before the store has it.
PENDING_WAIT_S: Final = 10.0


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
    ) -> tuple[list[Record], int]:
        """The turns up to ``response_id``, oldest first (``previous_response_id``), and their
        stored bytes."""
        await self._written(owner, response_id)
        try:
            return await sized_conversation(self.stores(local), owner, response_id, self.bounds)
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
