"""The tests' own redis-server (tests/redis_server.py): a port taken between its choice and the
server's bind (another test process, under pytest-xdist) costs a retry, not a failed test."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from bench.processes import free_port

from tests import redis_server


@pytest.mark.parametrize("cluster", [False, True], ids=["plain", "cluster-node"])
async def test_a_server_whose_port_was_taken_starts_on_another(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cluster: bool
) -> None:
    with socket.socket() as taken:  # somebody else's server, listening on the chosen port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        first = [port]
        pick = lambda: first.pop() if first else free_port()  # noqa: E731
        monkeypatch.setattr(redis_server, "free_port", pick)
        monkeypatch.setattr(redis_server, "cluster_port", pick)
        node_dir = str(tmp_path) if cluster else None
        async with redis_server.running_redis(cluster_dir=node_dir) as server:
            assert server.port != port
            assert server.process is not None and server.process.poll() is None
