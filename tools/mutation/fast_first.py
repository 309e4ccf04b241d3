"""A pytest plugin for `make mutation` only: quick tests first, and hung tests cut short.

mutmut hands pytest the tests that cover a mutant in no particular order and stops at the first
failure (``-x``), so a mutant that a unit test kills should not wait for an end-to-end test to
start a simulator and a gateway first. Loaded with ``-p tools.mutation.fast_first``.

A mutant that makes a stream hang (a read loop that never ends, a deadline that never fires)
would otherwise wait for mutmut's own limit, which is (the clean time of *every* test reaching
the mutated function + 1 s) x ``timeout_multiplier``: minutes for ``Upstream`` or ``h1_client``,
whose functions every end-to-end test reaches, and most of a run's tail. Here each test of a
mutant gets its own limit from its own clean time instead (``HANG_FACTOR`` x + ``HANG_SLACK_S``);
past it the process sends itself SIGXCPU, exactly what mutmut's limit does, so mutmut counts the
mutant as a timeout (as before, only sooner). Clean and statistics runs get no limit.

A listed equivalent mutant whose mutated source is the one a run saw survive is not run at all
(``fingerprint.py``).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
from collections.abc import Generator
from pathlib import Path

import pytest
from tools.mutation.fingerprint import LOCK, fingerprint_of, read_lock

# The slowest end-to-end files (seconds of servers and real sockets each) go last.
_SLOW_LAST = ("test_admission.py", "test_failover.py", "test_cancellation.py")

# A test that takes this many times its clean duration, plus the slack, is hung. Generous: two
# mutants run at once on 2 cores, and a loaded machine stretches a test two- to threefold.
HANG_FACTOR = 4.0
HANG_SLACK_S = 10.0
# mutmut writes the clean durations here (relative to the repository; tests run in mutants/).
_STATS = ("mutmut-stats.json", "mutants/mutmut-stats.json")
_DURATIONS = pytest.StashKey[dict[str, float]]()


def _cost(item: pytest.Item, durations: dict[str, float]) -> tuple[int, float]:
    """Unit tests, then end-to-end ones, then the slowest files; in each group the quickest
    first (clean durations from mutmut's statistics): with ``-x``, a mutant that a quick test
    kills should not wait for a slow one (a hypothesis test of seconds) to pass first."""
    path = item.nodeid.split("::", 1)[0]
    duration = durations.get(item.nodeid, 0.0)
    if path.startswith("tests/unit/"):
        return (0, duration)
    return (2 if path.endswith(_SLOW_LAST) else 1, duration)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _under_mutation() and _unchanged_equivalent(os.environ["MUTANT_UNDER_TEST"]):
        # Seen to survive, listed as equivalent, and its source is the same: nothing to run
        # (pytest exits 5, which mutmut records as "no tests"; report.py counts it as listed).
        config.hook.pytest_deselected(items=items[:])
        items[:] = []
        return
    durations = _durations(config) if _under_mutation() else {}
    items.sort(key=lambda item: _cost(item, durations))


class Selection:
    """The node ids a mutant's run was asked for, to build only their items.

    mutmut passes the tests that reach a mutant as node ids; pytest then builds an item for
    every test of each file named (every parametrization included) and drops the others: in a
    killed mutant's 0.55 s, 0.34 s was collection, for 708 items of which 29 were asked for.
    """

    def __init__(self, args: list[str]) -> None:
        self.whole: set[str] = set()  # ids asked for: a file or a class means all in it
        self.named: set[str] = set()  # every prefix of an id asked for, parameters dropped
        for arg in args:
            parts = arg.split("[", 1)[0].split("::")
            self.whole.add("::".join(parts))
            for end in range(1, len(parts) + 1):
                self.named.add("::".join(parts[:end]))

    def wanted(self, parent: str, name: str) -> bool:
        return parent in self.whole or f"{parent}::{name}" in self.named


_SELECTION = pytest.StashKey[Selection]()


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(
    collector: pytest.Module | pytest.Class, name: str, obj: object
) -> list[pytest.Item] | None:
    """No item for a test function or class of a mutant's files that was not asked for."""
    if not _under_mutation():
        return None
    is_test = (callable(obj) and collector.istestfunction(obj, name)) or (
        isinstance(obj, type) and collector.istestclass(obj, name)
    )
    if not is_test:
        return None
    selection = collector.config.stash.setdefault(_SELECTION, Selection(collector.config.args))
    if selection.wanted(collector.nodeid, name):
        return None
    return []


def _unchanged_equivalent(name: str) -> bool:
    locked = read_lock(LOCK)
    return name in locked and fingerprint_of(name, Path("src")) == locked[name]


def _under_mutation() -> bool:
    return "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", "")


def _clean_durations() -> dict[str, float]:
    for name in _STATS:
        path = Path(name)
        if path.exists():
            return _read_durations(path.resolve(), path.stat().st_mtime_ns)
    return {}


@functools.cache
def _read_durations(path: Path, mtime_ns: int) -> dict[str, float]:
    # Cached by modification time: mutmut's process reads the 2 MB file once (see
    # pytest_unconfigure), and each mutant's process inherits it instead of parsing it again.
    del mtime_ns
    durations = json.loads(path.read_text()).get("duration_by_test", {})
    return {str(k): float(v) for k, v in durations.items()}


def pytest_unconfigure(config: pytest.Config) -> None:
    """After mutmut's own sessions (its forced-fail check is the last before the mutants), read
    the statistics once in its process: every mutant is forked from it and inherits them."""
    if not _under_mutation():
        _clean_durations()


def _durations(config: pytest.Config) -> dict[str, float]:
    return config.stash.setdefault(_DURATIONS, _clean_durations())


def hang_limit_s(clean_s: float) -> float:
    return clean_s * HANG_FACTOR + HANG_SLACK_S


def _hung() -> None:
    os.kill(os.getpid(), signal.SIGXCPU)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    if not _under_mutation():
        yield
        return
    durations = _durations(item.config)
    # A timer thread, not SIGALRM: the test may be blocked anywhere, trio's epoll included.
    timer = threading.Timer(hang_limit_s(durations.get(item.nodeid, 0.0)), _hung)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
