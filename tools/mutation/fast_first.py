"""A pytest plugin for `make mutation` only: run the quick tests first.

mutmut hands pytest the tests that cover a mutant in no particular order and stops at the first
failure (``-x``), so a mutant that a unit test kills should not wait for an end-to-end test to
start a simulator and a gateway first. Loaded with ``-p tools.mutation.fast_first``.
"""

from __future__ import annotations

import pytest

# The slowest end-to-end files (seconds of servers and real sockets each) go last.
_SLOW_LAST = ("test_admission.py", "test_failover.py", "test_cancellation.py")


def _cost(item: pytest.Item) -> tuple[int, int]:
    path = item.nodeid.split("::", 1)[0]
    if path.startswith("tests/unit/"):
        return (0, 0)
    return (1, 1 if path.endswith(_SLOW_LAST) else 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_cost)  # stable: the order within each group stays pytest's
