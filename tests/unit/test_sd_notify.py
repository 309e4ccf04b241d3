"""systemd's readiness datagrams (sd_notify.py) never wait on the event loop."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from trio_gateway.ops.sd_notify import notify

# Linux queues a few datagrams per unread unix socket (net.unix.max_dgram_qlen, 10 by default
# in a fresh namespace, 512 on many hosts) and up to its receive buffer: far fewer than this.
ATTEMPTS = 5_000
# Thousands of failed sends take milliseconds; one that waits never ends.
WITHIN_S = 10.0


def test_a_receiver_that_does_not_read_makes_notify_fail_not_wait(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(path)
        sent: list[bool] = []

        def send_all() -> None:
            for _ in range(ATTEMPTS):
                sent.append(notify("STATUS=" + "x" * 1000, {"NOTIFY_SOCKET": path}))

        # On a thread, so a send that waits fails the test instead of hanging it.
        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        sender.join(WITHIN_S)
        assert len(sent) == ATTEMPTS, f"notify waited after {len(sent)} datagrams"
        assert sent[0] is True
        # Once the receiver's queue is full, each send is refused at once (before: it blocked).
        assert sent[-1] is False
        assert receiver.recv(2048) == b"STATUS=" + b"x" * 1000
