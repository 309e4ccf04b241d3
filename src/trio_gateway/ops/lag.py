"""How far behind a client is: a lower bound of the age of the oldest byte it has not taken.

A write to a client's socket returns once the kernel holds the bytes, so being behind does not
show where the gateway writes until the kernel's buffer is full (which on a fast network can be
megabytes, minutes of a slow reader's answer). What the client has taken is what its TCP stack
acknowledged: the kernel counts the bytes still unacknowledged (SIOCOUTQ on Linux). From marks of
how many bytes had been written by when, that count gives a time before which the oldest of them
was written. Pure: the caller passes the clock's time and the kernel's count.

A mark ``(w, t)`` says: at time ``t``, ``w`` bytes had been written; so any byte before ``w`` was
written no later than ``t``. With ``acked`` bytes taken, the oldest byte not taken is number
``acked``; the first mark past it bounds its write time from above, hence its age from below.
The bound is never above the true age (a client is never dropped early) and is at most one mark
interval below it.
"""

from __future__ import annotations


class LagMeter:
    """Marks taken at most every ``mark_every_s``; at most ``max_marks`` kept (dropping the
    oldest only loosens the bound: the next mark is later, so the age it gives is smaller).

    One per streamed answer, thousands at once: the marks are a plain list (empty for a client
    that keeps up, a few dozen at most for one that falls behind), not a deque, whose first
    block alone is half a KiB."""

    def __init__(self, *, mark_every_s: float, max_marks: int) -> None:
        self.mark_every_s = mark_every_s
        self.max_marks = max_marks
        self.written = 0  # bytes handed to the kernel so far
        self._marks: list[tuple[int, float]] = []
        self._next_mark = float("-inf")

    def __len__(self) -> int:
        return len(self._marks)

    def due(self, now: float) -> bool:
        """Whether a mark (and so a look at the kernel's count) is due."""
        return now >= self._next_mark

    def sample(self, now: float, unacked: int) -> float:
        """The lag's lower bound, given the bytes still unacknowledged; marks ``now`` when a
        mark is due (so at most one per ``mark_every_s``, however often this is asked).

        ``unacked`` is clamped to what was written (a kernel count taken as the socket closes
        can say anything)."""
        marks = self._marks
        unacked = min(max(unacked, 0), self.written)
        if not unacked:
            marks.clear()  # caught up: no byte is waiting, whatever was written before
            self._next_mark = now + self.mark_every_s
            return 0.0
        acked = self.written - unacked
        taken = 0
        while taken < len(marks) and marks[taken][0] <= acked:
            taken += 1  # every byte before it was taken
        del marks[:taken]
        lag = now - marks[0][1] if marks else 0.0
        if now >= self._next_mark and (not marks or marks[-1][0] < self.written):
            # The earliest mark of a count is the tightest: a later one of the same is skipped.
            marks.append((self.written, now))
            if len(marks) > self.max_marks:
                del marks[0]
            self._next_mark = now + self.mark_every_s
        return lag
