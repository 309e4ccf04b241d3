"""The lanes of one Responses WebSocket: which ``response.create`` runs now, which waits, and
which is refused. Pure.

A lane is a ``stream_id`` (no ``stream_id``: the one default lane, ``None``). Within a lane the
creates run one after the other, in the order they came; lanes run beside each other, at most
``max_lanes`` at once. A create for a lane already answering waits behind it, within
``max_queued_bytes`` for all the socket's waiting creates together (each counted at least
:data:`MIN_ITEM_BYTES`, so many tiny messages are bounded as well as a few large ones). Past
either bound the create is refused, and the socket goes on.

The shell (``socket.py``) starts a create that :meth:`Lanes.submit` says to start, and tells
:meth:`Lanes.finish` when a lane's answer has ended, which hands it that lane's next create.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Generic, TypeVar

import attrs

T = TypeVar("T")
Lane = str | None

# What a waiting create is counted at, however small: its place in the queue costs too.
MIN_ITEM_BYTES = 1024


class Verdict(enum.Enum):
    START = "start"  # its lane was idle: run it now
    QUEUED = "queued"  # it waits behind its lane's answer
    TOO_MANY_LANES = "too_many_lanes"  # refused: max_lanes lanes are answering
    QUEUE_FULL = "queue_full"  # refused: the waiting creates hold max_queued_bytes


@attrs.frozen(kw_only=True)
class LaneStats:
    lanes: int  # lanes answering
    queued: int  # creates waiting behind them
    queued_bytes: int


@attrs.define
class _Waiting(Generic[T]):
    item: T
    size: int


class Lanes(Generic[T]):
    """One socket's lanes: the creates waiting in each, and the bounds."""

    def __init__(self, *, max_lanes: int, max_queued_bytes: int) -> None:
        self._max_lanes = max_lanes
        self._max_queued_bytes = max_queued_bytes
        # A lane is here while it answers; its deque holds what waits behind the answer.
        self._lanes: dict[Lane, deque[_Waiting[T]]] = {}
        self._queued_bytes = 0
        self._queued = 0

    def submit(self, lane: Lane, item: T, size: int) -> Verdict:
        """A create for ``lane``, of ``size`` bytes: start it, queue it, or refuse it."""
        waiting = self._lanes.get(lane)
        if waiting is None:
            if len(self._lanes) >= self._max_lanes:
                return Verdict.TOO_MANY_LANES
            self._lanes[lane] = deque()
            return Verdict.START
        counted = max(size, MIN_ITEM_BYTES)
        if self._queued_bytes + counted > self._max_queued_bytes:
            return Verdict.QUEUE_FULL
        waiting.append(_Waiting(item, counted))
        self._queued_bytes += counted
        self._queued += 1
        return Verdict.QUEUED

    def finish(self, lane: Lane) -> T | None:
        """``lane``'s answer ended: its next create, now answering, or None (the lane is idle
        and no longer counts against ``max_lanes``)."""
        waiting = self._lanes[lane]
        if not waiting:
            del self._lanes[lane]
            return None
        following = waiting.popleft()
        self._queued_bytes -= following.size
        self._queued -= 1
        return following.item

    def answering(self, lane: Lane) -> bool:
        return lane in self._lanes

    @property
    def busy(self) -> bool:
        """Whether any lane is answering."""
        return bool(self._lanes)

    def take_queued(self) -> list[tuple[Lane, T]]:
        """Every waiting create, oldest first within each lane, no longer waiting (the socket
        is closing, or will take no more): each lane answers what it answers now, then ends."""
        taken = [(lane, one.item) for lane, waiting in self._lanes.items() for one in waiting]
        for waiting in self._lanes.values():
            waiting.clear()
        self._queued_bytes = self._queued = 0
        return taken

    def statistics(self) -> LaneStats:
        return LaneStats(
            lanes=len(self._lanes), queued=self._queued, queued_bytes=self._queued_bytes
        )
