"""Polls ``GET /healthz`` on a fixed schedule from a process of its own, until its stdin ends.

    python -m bench.healthz_poller PORT INTERVAL_S

Prints ``ready`` once its first answer came, then, when stdin closes, one JSON list of
``[scheduled_at, latency_s]`` per poll: ``scheduled_at`` on ``time.monotonic()`` (the machine's
one monotonic clock, which the test reads too), the latency counted from when the poll was due,
not from when it was sent. A gateway that stalls for a second thus shows every poll it held
back, not one slow poll among many fast ones (coordinated omission). Its own process, so that
nothing in the gateway's (its GIL, its loop) stops the clock that judges it.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import time

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n"


def answer(sock: socket.socket, buffer: bytearray) -> None:
    """Read one answer (its head, then ``content-length`` bytes) off a kept-alive connection."""
    while b"\r\n\r\n" not in buffer:
        buffer += recv(sock)
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += recv(sock)
    buffer[:] = rest[length:]


def recv(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise ConnectionError("the gateway closed the connection")
    return data


def main(port: int, interval_s: float) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray()
    sock.sendall(REQUEST)
    answer(sock, buffer)
    print("ready", flush=True)
    polls: list[tuple[float, float]] = []
    due = time.monotonic()
    while not select.select([sys.stdin], [], [], 0)[0]:
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        sock.sendall(REQUEST)
        answer(sock, buffer)
        polls.append((due, time.monotonic() - due))
        due += interval_s
    sys.stdin.read()
    print(json.dumps(polls), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
