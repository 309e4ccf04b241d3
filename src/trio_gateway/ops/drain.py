"""Graceful shutdown's bookkeeping: every answer being produced, so a drain can end them."""

from __future__ import annotations

from types import TracebackType

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

    def track(self, scope: trio.CancelScope) -> _Tracked:
        """``with drain.track(scope):`` around an answer's production: enters ``scope``, which
        the drain's end cancels."""
        return _Tracked(self, scope)

    def _done(self, scope: trio.CancelScope) -> None:
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


class _Tracked:
    """A class, not ``@contextmanager``: one per answer, thousands at once, and a generator and
    its wrapper are most of a KiB more each."""

    __slots__ = ("_drain", "_scope")

    def __init__(self, drain: Drain, scope: trio.CancelScope) -> None:
        self._drain = drain
        self._scope = scope

    def __enter__(self) -> trio.CancelScope:
        self._drain._producers.add(self._scope)
        return self._scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            return self._scope.__exit__(exc_type, exc, tb)
        finally:
            self._drain._done(self._scope)
