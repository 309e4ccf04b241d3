"""A WebSocket's translated conversations: for each of its recent responses, what the chat
messages of the conversation up to it are (``items.Prefix``), so a turn continuing one
translates only its new input, not every earlier turn again (issue 41: a continued turn on a
socket had read back and translated its whole conversation, as ``store: false`` over HTTP
translates the whole body).

A prefix stands for the socket's own records (its memory, ``response_memory.py``), and is used
only while the memory still holds the whole chain it was made from, down to its first turn and
within the chain's bounds: the walk still runs, on the records' ids and sizes (each used again,
as a read of it would), only their texts are not decoded and translated again. A chain the
memory no longer wholly holds (a record evicted or expired, or its start in the shared store)
is read back as before, with the same answer (a refusal included). What a prefix is made of is
what reading the records back would make: the turn's history as it was read, then the turn's
own stored items (its input as kept, its output) read as the next turn's history reads them.

Bounded: at most :data:`MAX_PREFIXES` prefixes and ``max_bytes`` (the socket's memory bound),
each counted as its whole conversation's stored bytes and :data:`MESSAGE_BYTES` a message
(prefixes of one conversation share their messages: counted once each, they are counted more
than they hold); least recently used first out. One that alone is past the bound is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

import attrs

from trio_gateway.accounting.response_memory import MemoryResponseStore
from trio_gateway.accounting.response_records import ChainBounds
from trio_gateway.core.errors import RequestError
from trio_gateway.fronts.responses.items import Opener, Prefix, Turns

# Prefixes kept per socket: an agent continues its lanes' last responses (8 lanes at most by
# default), a fork one a little older.
MAX_PREFIXES: Final = 16
# What a message costs beyond its text (its dict, its strings' headers): counted on top.
MESSAGE_BYTES: Final = 512


@attrs.frozen
class _Entry:
    prefix: Prefix
    turns: int  # the chain's records
    charge: int  # what it counts against the bound


class Prefixes:
    """The translated conversations of one socket's responses, by owner and response id."""

    def __init__(
        self,
        memory: MemoryResponseStore,
        *,
        max_bytes: int,
        max_prefixes: int = MAX_PREFIXES,
    ) -> None:
        self._memory = memory
        self._max_bytes = max_bytes
        self._max_prefixes = max_prefixes
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self, owner: str, response_id: str, bounds: ChainBounds
    ) -> tuple[Prefix, int, int] | None:
        """The conversation up to ``response_id`` as read, its records and their stored bytes,
        when a prefix of it is kept and the memory still holds its whole chain within
        ``bounds`` (its records used again); else None, nothing used."""
        key = (owner, response_id)
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        held = self._memory.held(owner, response_id, bounds)
        if held is None or held[0] != entry.turns:
            self._drop(key)  # its chain is gone for good: records never come back
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry.prefix, held[0], held[1]

    def keep(
        self,
        owner: str,
        response_id: str,
        history: Prefix,
        turn_items: Sequence[dict[str, Any]],
        *,
        opener: Opener,
        turns: int,
        size: int,
    ) -> None:
        """The conversation up to ``response_id``: ``history`` (the turn's, as read), then
        ``turn_items`` (its record's input and output items), read as a later turn's history
        reads them. ``turns`` and ``size``: the chain's records and stored bytes, this one's
        included. A prefix that depends on its body's tools (a call in a namespace) is not
        kept, nor one past the bound alone."""
        dropped: list[str] = []
        reader = Turns({}, opener, dropped, {})
        try:
            read = reader.history(turn_items, history)
        except RequestError:
            return  # read back, it is refused the same way: nothing to keep
        prefix = reader.snapshot(0, 0, read)
        charge = size + MESSAGE_BYTES * (len(prefix.messages) + 1)
        if prefix.namespaced or charge > self._max_bytes:
            return
        key = (owner, response_id)
        self._drop(key)
        self._entries[key] = _Entry(prefix=prefix, turns=turns, charge=charge)
        self.bytes += charge
        while len(self._entries) > self._max_prefixes or self.bytes > self._max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry.charge
