"""Graceful shutdown's bookkeeping: every answer being produced, so a drain can end them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

SHUTDOWN = "shutdown"


class Drain:
    """The producers in flight, so a stopping server can end every answer cleanly: each one's
    upstream is closed and its client gets a ``shutting_down`` error instead of a cut stream."""

    def __init__(self) -> None:
        self._producers: set[trio.CancelScope] = set()
        self.stopping = False
        # For long-lived connections (WebSockets) that must close themselves once idle.
        self.began = trio.Event()
        # Set once stopping with no answer left: the server may then close its listener.
        self._idle = trio.Event()

    def __len__(self) -> int:
        return len(self._producers)

    @contextmanager
    def track(self) -> Iterator[trio.CancelScope]:
        scope = trio.CancelScope()
        self._producers.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._producers.discard(scope)
            if self.stopping and not self._producers:
                self._idle.set()

    def begin(self) -> None:
        """No new answers from now on; those running go on."""
        self.stopping = True
        self.began.set()
        if not self._producers:
            self._idle.set()

    async def idle(self) -> None:
        """Wait until stopping and every answer has ended (finished, or cancelled by
        :meth:`cancel_all`)."""
        await self._idle.wait()

    def cancel_all(self) -> None:
        self.begin()
        for scope in self._producers:
            scope.cancel(reason=SHUTDOWN)
