"""What a stored response is, what every store of them does, and how a conversation is read
back from them: the pure part of the Responses front's storage (the stores are
``response_memory.py``, ``response_sqlite.py``, ``response_redis.py``).

A record is one turn: the response object (its output items included, as ``GET
/v1/responses/{id}`` answers it), the turn's own input items (those the gateway used: nothing it
dropped), and the id of the response it continued. Never a copy of the conversation: a chain of
N turns of B bytes each stores N * B bytes, and is read back by walking it from its newest turn,
bounded in turns and bytes (:class:`ChainBounds`). A walk past a bound is refused
(``conversation_too_long``), never cut short: the model would get a conversation with its
beginning silently missing.

Stores hold records under an owner (the API key's name, ``""`` without keys): a lookup names
the owner, so a key never reads another key's responses. The walk (:func:`conversation`) and
the item lookup (:func:`find_item`) take several stores, tried in order: a WebSocket's own
recent responses first, then the shared store (issue 41), and a chain may run across them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Final, Protocol

import attrs
import msgspec

from trio_gateway.core.errors import ConversationTooLong, ResponseNotFound

# The gateway's own item ids: rs_/msg_/fc_, the response id's 32 hex digits, the item's index
# (fronts/responses/events.py). An item's response is read off its id: no index of items.
ITEM_ID: Final = re.compile(r"(?:rs|msg|fc)_([0-9a-f]{32})_[0-9]{1,6}")


class StoreError(Exception):
    """The store could not answer (Redis down or slow, the file unwritable)."""


@attrs.frozen(kw_only=True)
class Record:
    """One stored turn."""

    id: str
    previous: str | None  # the response this one continued, of the same owner
    response: dict[str, Any]  # the response object, its output included
    input: list[dict[str, Any]]  # this turn's input items, as the gateway used them

    def items(self) -> list[dict[str, Any]]:
        """The turn's items in the conversation's order: its input, then its output."""
        output: list[dict[str, Any]] = self.response.get("output") or []
        return [*self.input, *output]


@attrs.frozen(kw_only=True)
class Stored:
    """A record as a store keeps it: its text, and the text's size in UTF-8 bytes (what the
    byte bounds count)."""

    id: str
    previous: str | None
    text: str
    size: int

    @classmethod
    def of(cls, record: Record) -> Stored:
        body = {"previous": record.previous, "input": record.input, "response": record.response}
        text = dumps(body)
        return cls(id=record.id, previous=record.previous, text=text, size=len(text.encode()))


def dumps(value: object) -> str:
    """A record's text, or a part of it: what its size counts."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


_DECODER = msgspec.json.Decoder()  # stateless: one shared instance is safe


def load_record(response_id: str, text: str | bytes) -> Record:
    # msgspec reads a record's text in half json's time (a continuation reads every turn of
    # its conversation); what it refuses, json reads as before.
    try:
        body = _DECODER.decode(text)
    except msgspec.DecodeError:
        body = json.loads(text)
    return Record(
        id=response_id,
        previous=body.get("previous"),
        response=body["response"],
        input=body.get("input") or [],
    )


@attrs.frozen(kw_only=True)
class ChainBounds:
    """How much of a chain a walk may read: turns, and the records' bytes."""

    max_turns: int
    max_bytes: int

    def less(self, turns: int, size: int) -> ChainBounds:
        return ChainBounds(max_turns=self.max_turns - turns, max_bytes=self.max_bytes - size)


@attrs.frozen(kw_only=True)
class Chain:
    """What one store holds of a chain, from the id asked for back: its records (newest
    first), their bytes, and ``next``, the id the walk goes on with (one this store does not
    hold, or where it stopped), None at the chain's first turn. ``over``: it stopped at
    ``next`` because that record would have taken the walk past its bounds."""

    records: tuple[Record, ...] = ()
    size: int = 0
    next: str | None = None
    over: bool = False


class ResponseStore(Protocol):
    """Records under their owner, each kept for the store's TTL from its last use (written,
    or read by a walk that continued it), within the store's byte bounds (oldest use first
    out)."""

    async def put(self, owner: str, stored: Stored) -> None: ...

    async def get(self, owner: str, response_id: str) -> Record | None: ...

    async def chain(self, owner: str, response_id: str, bounds: ChainBounds) -> Chain:
        """The records from ``response_id`` back, while this store holds them and within
        ``bounds``; each one read is used again (its TTL starts over)."""
        ...

    async def delete(self, owner: str, response_id: str) -> bool: ...


def fits(turns: int, size: int, record_size: int, bounds: ChainBounds) -> bool:
    """Whether a walk that read ``turns`` records of ``size`` bytes may read one more."""
    return turns + 1 <= bounds.max_turns and size + record_size <= bounds.max_bytes


async def conversation(
    stores: Sequence[ResponseStore], owner: str, response_id: str, bounds: ChainBounds
) -> list[Record]:
    """The chain that ends at ``response_id``, oldest turn first, from whichever of
    ``stores`` holds each part. Raises ``ResponseNotFound`` when none holds ``response_id``,
    or a turn before it (expired, deleted, or evicted by its owner's quota), and
    ``ConversationTooLong`` past ``bounds``."""
    records, _ = await sized_conversation(stores, owner, response_id, bounds)
    return records


async def sized_conversation(
    stores: Sequence[ResponseStore], owner: str, response_id: str, bounds: ChainBounds
) -> tuple[list[Record], int]:
    """:func:`conversation`, and its records' stored bytes: what translating it will cost,
    known without reading it again."""
    records: list[Record] = []
    size = 0
    wanted: str | None = response_id
    while wanted is not None:
        part = Chain(next=wanted)
        for store in stores:
            part = await store.chain(owner, wanted, bounds.less(len(records), size))
            if part.records or part.over:
                break
        if part.over:
            raise ConversationTooLong(
                f"The conversation up to '{response_id}' is longer than the gateway reads back "
                f"({bounds.max_turns} turns, {bounds.max_bytes} bytes: [responses] "
                "max_chain_turns, max_chain_bytes). Start a new one from its last turns, or "
                "send its items themselves.",
                param="previous_response_id",
            )
        if not part.records:
            if not records:
                raise ResponseNotFound(
                    f"Previous response with id '{response_id}' not found.",
                    param="previous_response_id",
                )
            raise ResponseNotFound(
                f"Previous response with id '{response_id}' continues '{wanted}', which is no "
                "longer stored (expired, deleted, or its key's storage quota was full).",
                param="previous_response_id",
            )
        records += part.records
        size += part.size
        wanted = part.next
    records.reverse()
    return records, size


def item_response_id(item_id: str) -> str | None:
    """The response an output item of the gateway's belongs to, read off the item's id."""
    found = ITEM_ID.fullmatch(item_id)
    return f"resp_{found[1]}" if found is not None else None


async def find_items(
    stores: Sequence[ResponseStore], owner: str, item_ids: Sequence[str], bounds: ChainBounds
) -> dict[str, dict[str, Any]]:
    """The output items of the owner's stored responses that ``item_ids`` name, by id (those
    found: an id that is not the gateway's, or whose response is not the owner's, is not).
    Each response is read once, from the first of ``stores`` that holds it; past ``bounds`` (the
    responses read, the items' bytes) the lookup is refused: they become the conversation."""
    wanted: dict[str, set[str]] = {}
    for item_id in item_ids:
        response_id = item_response_id(item_id)
        if response_id is not None:
            wanted.setdefault(response_id, set()).add(item_id)
    if len(wanted) > bounds.max_turns:
        raise ConversationTooLong(
            f"The input refers to items of {len(wanted)} responses; the gateway reads at most "
            f"{bounds.max_turns} ([responses] max_chain_turns).",
            param="input",
        )
    found: dict[str, dict[str, Any]] = {}
    size = 0
    for response_id, ids in wanted.items():
        record = None
        for store in stores:
            record = await store.get(owner, response_id)
            if record is not None:
                break
        for item in record.response.get("output") or () if record is not None else ():
            if item.get("id") in ids:
                found[item["id"]] = item
                size += len(dumps(item).encode())
        if size > bounds.max_bytes:
            raise ConversationTooLong(
                f"The items the input refers to are more than the gateway reads back "
                f"({bounds.max_bytes} bytes: [responses] max_chain_bytes).",
                param="input",
            )
    return found
