"""systemd's readiness protocol (``Type=notify``): a datagram to ``$NOTIFY_SOCKET``.

``READY=1`` once the gateway listens (so ``systemctl start`` returns when it can serve, and
units ordered after it start then), ``RELOADING=1`` / ``READY=1`` around a reload, and
``STOPPING=1`` when the drain begins. Without ``$NOTIFY_SOCKET`` (not under systemd) nothing
is sent. A failure to send (a full receiver included: it is never waited for) is logged, never
raised: the gateway serves either way.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger("trio_gateway")


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (``KEY=VALUE`` lines); True when it was sent."""
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # the abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            # Sent from the event loop: a receiver whose queue is full (systemd busy) makes
            # this fail and be logged, not wait and stop the gateway.
            sock.setblocking(False)
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("sd_notify to %s failed: %s", address.lstrip("\0"), exc)
        return False
    return True


def reloading() -> str:
    """``RELOADING=1`` with the monotonic timestamp systemd asks for alongside it."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return f"RELOADING=1\nMONOTONIC_USEC={usec}"
