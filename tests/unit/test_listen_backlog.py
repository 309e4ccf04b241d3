"""The listening socket's accept queue: thousands of clients arriving at once are queued by the
kernel, not refused (hypercorn's own default is 100)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trio_gateway.process.serve import LISTEN_BACKLOG, hypercorn_config, listening_sockets


def test_the_gateway_listens_with_a_deep_accept_queue() -> None:
    if shutil.which("ss") is None:
        pytest.fail("ss (iproute2) is needed to read a listening socket's backlog")
    config = hypercorn_config(
        "127.0.0.1:0", graceful_timeout_s=1.0, websocket_max_message_bytes=1024
    )
    sockets = listening_sockets(config, stall_timeout_s=5.0)
    [sock] = sockets.insecure_sockets
    try:
        port = sock.getsockname()[1]
        # For a listening socket, ss shows the backlog in the Send-Q column.
        line = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
        ).stdout.split()
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        assert line[0] == "LISTEN" and int(line[2]) == min(LISTEN_BACKLOG, somaxconn) > 100
    finally:
        sock.close()
