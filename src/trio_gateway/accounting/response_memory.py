"""Stored responses in this process's memory, bounded in bytes: the store of a gateway with
neither ``[redis]`` nor a ledger file, and the shape of a WebSocket's own recent responses
(issue 41: one of these per socket, with the socket's byte bound).

Records are kept as their text (a stored record never changes with what its caller does next)
in the order of their last use: written, or read by a walk that continued them. Each expires
``ttl_s`` after its last use, so that order is also the order of expiry. Past a bound the
oldest use goes first: an owner's own oldest past its ``key_quota_bytes``, anyone's past
``max_bytes`` or ``max_responses``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import attrs

from trio_gateway.accounting.response_records import (
    Chain,
    ChainBounds,
    Record,
    Stored,
    fits,
    load_record,
)

Clock = Callable[[], float]


@attrs.define
class _Entry:
    expires_at: float
    stored: Stored


class MemoryResponseStore:
    """Records in this process, within ``max_bytes`` (all owners), ``key_quota_bytes`` (each
    owner) and ``max_responses``."""

    def __init__(
        self,
        *,
        ttl_s: float,
        max_bytes: int,
        key_quota_bytes: int,
        max_responses: int | None = None,
        clock: Clock = time.time,
    ) -> None:
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes
        self._key_quota_bytes = key_quota_bytes
        self._max_responses = max_responses
        self._clock = clock
        # Every record, oldest use first; and each owner's ids in the same order.
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._owners: dict[str, OrderedDict[str, None]] = {}
        self._owner_bytes: dict[str, int] = {}
        self.bytes = 0  # what the records' texts hold, all owners

    def __len__(self) -> int:
        return len(self._entries)

    def owner_bytes(self, owner: str) -> int:
        return self._owner_bytes.get(owner, 0)

    async def put(self, owner: str, stored: Stored) -> None:
        self._sweep()
        self._remove(owner, stored.id)
        self._entries[(owner, stored.id)] = _Entry(self._clock() + self._ttl_s, stored)
        self._owners.setdefault(owner, OrderedDict())[stored.id] = None
        self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + stored.size
        self.bytes += stored.size
        ids = self._owners[owner]
        while self._owner_bytes[owner] > self._key_quota_bytes and len(ids) > 1:
            self._remove(owner, next(iter(ids)))
        while len(self._entries) > 1 and (
            self.bytes > self._max_bytes
            or (self._max_responses is not None and len(self._entries) > self._max_responses)
        ):
            self._remove(*next(iter(self._entries)))

    def _live(self, owner: str, response_id: str) -> _Entry | None:
        entry = self._entries.get((owner, response_id))
        if entry is not None and entry.expires_at <= self._clock():
            self._remove(owner, response_id)
            return None
        return entry

    async def get(self, owner: str, response_id: str) -> Record | None:
        entry = self._live(owner, response_id)
        return None if entry is None else load_record(response_id, entry.stored.text)

    async def chain(self, owner: str, response_id: str, bounds: ChainBounds) -> Chain:
        entries, size, wanted = self._walk(owner, response_id, bounds)
        if entries is None:
            return Chain(next=wanted, over=True)
        self._use_all(owner, entries)
        records = tuple(load_record(e.stored.id, e.stored.text) for e in entries)
        return Chain(records=records, size=size, next=wanted)

    def held(self, owner: str, response_id: str, bounds: ChainBounds) -> tuple[int, int] | None:
        """The turns and bytes of the chain up to ``response_id`` when this store holds all
        of it, down to its first turn, within ``bounds``: each used again, as :meth:`chain`
        does, and none decoded. None (nothing used) otherwise."""
        entries, size, wanted = self._walk(owner, response_id, bounds)
        if entries is None or not entries or wanted is not None:
            return None
        self._use_all(owner, entries)
        return len(entries), size

    def _walk(
        self, owner: str, response_id: str, bounds: ChainBounds
    ) -> tuple[list[_Entry] | None, int, str | None]:
        """The entries from ``response_id`` back while held (None past ``bounds``), their
        bytes, and the id the walk stopped at."""
        entries: list[_Entry] = []
        size = 0
        wanted: str | None = response_id
        while wanted is not None:
            entry = self._live(owner, wanted)
            if entry is None:
                break
            if not fits(len(entries), size, entry.stored.size, bounds):
                return None, size, wanted
            entries.append(entry)
            size += entry.stored.size
            wanted = entry.stored.previous
        return entries, size, wanted

    def _use_all(self, owner: str, entries: list[_Entry]) -> None:
        expires_at = self._clock() + self._ttl_s
        for entry in entries:
            self._use(owner, entry, expires_at)

    def _use(self, owner: str, entry: _Entry, expires_at: float) -> None:
        entry.expires_at = expires_at
        self._entries.move_to_end((owner, entry.stored.id))
        self._owners[owner].move_to_end(entry.stored.id)

    async def delete(self, owner: str, response_id: str) -> bool:
        if self._live(owner, response_id) is None:
            return False
        self._remove(owner, response_id)
        return True

    def _remove(self, owner: str, response_id: str) -> None:
        entry = self._entries.pop((owner, response_id), None)
        if entry is None:
            return
        ids = self._owners[owner]
        del ids[response_id]
        self._owner_bytes[owner] -= entry.stored.size
        self.bytes -= entry.stored.size
        if not ids:
            del self._owners[owner], self._owner_bytes[owner]

    def _sweep(self) -> None:
        """Drops what expired: the oldest uses, at the front."""
        now = self._clock()
        while self._entries:
            (owner, response_id), entry = next(iter(self._entries.items()))
            if entry.expires_at > now:
                return
            self._remove(owner, response_id)
