"""The keys file while serving: re-read when it changes; a bad file keeps the keys loaded before."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Sequence

from trio_gateway.core.errors import Unauthorized
from trio_gateway.core.keys import ApiKey, KeyRing, KeysFileError, load_keys
from trio_gateway.core.words import counted

log = logging.getLogger("trio_gateway")

# A changed keys file is noticed within this long (checked on the request path, not more often).
RELOAD_CHECK_INTERVAL_S = 1.0


_Stamp = tuple[int, int, int]  # inode, mtime in ns, size: a rename, a rewrite or an append


def _stamp(path: str) -> _Stamp:
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class KeyStore:
    """The keys of ``path``, re-read when the file changes (a rename onto it, a rewrite, an
    append), noticed by a ``stat`` at most once per ``check_interval_s``, on the request path.

    A new file that cannot be read or is invalid leaves the keys as they were, and every
    problem is logged, once per change of the file. The check and the swap have no ``await``
    between them, so concurrent requests under trio always see one whole ring."""

    def __init__(
        self,
        path: str,
        *,
        known_aliases: Collection[str] | None = None,
        check_interval_s: float = RELOAD_CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._known_aliases = None if known_aliases is None else frozenset(known_aliases)
        self.check_interval_s = check_interval_s
        self._clock = clock
        try:
            self._stamp: _Stamp | None = _stamp(path)
        except OSError as exc:
            raise KeysFileError(path, [f"cannot read: {exc.strerror or exc}"]) from None
        self._ring = load_keys(path, known_aliases=self._known_aliases)
        self._checked_at = clock()

    def ring(self) -> KeyRing:
        """The current keys, after a reload if the file changed since the last check."""
        now = self._clock()
        if now - self._checked_at >= self.check_interval_s:
            self._checked_at = now
            self._reload_if_changed()
        return self._ring

    def authenticate(self, presented: str | None) -> ApiKey:
        """The key's entry, or 401 ``invalid_api_key``. The message never quotes the key."""
        ring = self.ring()
        if presented is None:
            raise Unauthorized(
                "missing API key: send it as 'Authorization: Bearer <key>' "
                "(on a WebSocket also as the subprotocol 'bearer.<key>' or '?access_token=<key>')"
            )
        key = ring.lookup(presented)
        if key is None:
            raise Unauthorized("invalid API key")
        return key

    def replace(self, path: str, ring: KeyRing, *, known_aliases: Collection[str]) -> None:
        """A config reload's keys (read and checked by the caller): maybe a new path, and the
        new aliases that keys may name."""
        try:
            stamp: _Stamp | None = _stamp(path)
        except OSError:
            stamp = None
        self.path = path
        self._known_aliases = frozenset(known_aliases)
        self._stamp = stamp
        self._ring = ring
        self._checked_at = self._clock()

    def _reload_if_changed(self) -> None:
        try:
            stamp: _Stamp | None = _stamp(self.path)
        except OSError as exc:
            stamp = None
            problems = [f"cannot read: {exc.strerror or exc}"]
        if stamp is not None and stamp == self._stamp:
            return
        if stamp is None:
            if self._stamp is not None:  # say it once, not every second
                self._log_kept(problems, ())
            self._stamp = None
            return
        self._stamp = stamp
        try:
            ring = load_keys(self.path, known_aliases=self._known_aliases)
        except KeysFileError as exc:
            self._log_kept(exc.problems, exc.keys)
            return
        log.info("auth: %s from %s (reloaded)", counted(len(ring), "key"), self.path)
        self._ring = ring

    def _log_kept(self, problems: list[str], broken: Sequence[str]) -> None:
        """One error per problem, then which keys broke the file and what callers meet: the
        whole file is refused, so a key added in the same change is refused too (401)."""
        for problem in problems:
            log.error("keys file %s: %s", self.path, problem)
        what = counted(len(problems), "problem")
        if broken:
            names = ", ".join(repr(name) for name in broken)
            what = f"{'key' if len(broken) == 1 else 'keys'} {names} invalid ({what})"
        log.error(
            "keys file %s: not reloaded: %s; still using the %s loaded before, so a key "
            "added since gets 401 until the file is fixed",
            self.path,
            what,
            counted(len(self._ring), "key"),
        )
