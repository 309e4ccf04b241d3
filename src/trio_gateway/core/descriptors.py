"""Running out of file descriptors (``EMFILE``: the process's limit; ``ENFILE``: the system's).

Every open stream holds two descriptors (the client's and the upstream's), so a gateway past its
limit fails to accept or to dial. Either is the gateway's own overload, not a provider's fault
and not a bug: the client gets a 503 ``overloaded`` with ``Retry-After`` (``DescriptorsExhausted``),
the provider's health is left alone, and the log says so once per :data:`LOG_INTERVAL_S` with
how many times it happened since, never with a traceback. The tally is the process's (read by
``gateway_descriptors_exhausted_total{where}``), as the limit is."""

from __future__ import annotations

import errno
from typing import Final

EXHAUSTION_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE})
LOG_INTERVAL_S: Final = 10.0
# Where it can happen: a client's connection could not be accepted, an upstream not dialled.
PLACES: Final = ("accept", "dial")


def is_exhaustion(exc: BaseException | None) -> bool:
    return isinstance(exc, OSError) and exc.errno in EXHAUSTION_ERRNOS


class DescriptorTally:
    """How many times each place ran out, and when a log line is due."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(PLACES, 0)
        self._logged_at: float | None = None
        self._unlogged = 0

    def note(self, where: str, now: float) -> int | None:
        """Count one; the number of times since the last line when a line is due, else None."""
        self.counts[where] += 1
        self._unlogged += 1
        if self._logged_at is not None and now - self._logged_at < LOG_INTERVAL_S:
            return None
        self._logged_at = now
        unlogged, self._unlogged = self._unlogged, 0
        return unlogged

    def by_place(self) -> dict[str, int]:
        return dict(self.counts)


TALLY = DescriptorTally()
