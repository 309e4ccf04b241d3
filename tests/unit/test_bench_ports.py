"""bench/processes.quiet_ports: the ports a test process (or a benchmark) gives its children.
Under pytest-xdist each test process draws from its own share, so two never choose the same
port in the time between choosing it and a child binding it."""

from __future__ import annotations

import pytest
from bench import processes


def share(monkeypatch: pytest.MonkeyPatch, worker: str | None, count: int) -> range:
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    return range(*processes._quiet_range())


def test_each_test_process_has_a_share_of_its_own_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    whole = share(monkeypatch, None, 1)
    assert whole.start == 10_000 and whole.stop <= max(processes.ephemeral_low(), 10_001)
    shares = [share(monkeypatch, f"gw{i}", 3) for i in range(3)]
    for i, mine in enumerate(shares):
        assert whole.start <= mine.start < mine.stop <= whole.stop
        for other in shares[i + 1 :]:
            assert mine.stop <= other.start  # disjoint
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    ports = processes.quiet_ports(20)
    assert len(set(ports)) == 20 and all(p in shares[1] for p in ports)
