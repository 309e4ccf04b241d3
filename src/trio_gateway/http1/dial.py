"""Dialling an upstream with its receive buffer set before the handshake.

``trio.open_tcp_stream`` gives no hook between creating a socket and connecting it, and a
receive buffer set after the handshake is too late on loopback: the SYN has already advertised
a window sized for the default buffer, the sender sizes its segments to half the largest window
it has seen (Linux's ``tcp_bound_to_half_wnd``), and once the smaller buffer is full those
segments no longer fit the window it offers. The sender is then left to window probes, and an
answer held back once (its client was slow) came at 40 to 140 KB/s for the rest of its life
(docs/benchmarks.md). Set before ``connect``, the small window is the only one the sender ever
sees. The rest is what ``open_tcp_stream`` does: every address the name resolves to, one family
then the other, a new attempt every ``HAPPY_EYEBALLS_DELAY_S`` or as soon as one fails, the
first to connect wins (RFC 8305, as trio does it).
"""

from __future__ import annotations

import math
import socket
from collections.abc import Sequence
from typing import Any

import trio

from trio_gateway.core.descriptors import is_exhaustion

HAPPY_EYEBALLS_DELAY_S = 0.25  # trio's and RFC 8305's

AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]


def attempt_order(infos: Sequence[AddrInfo]) -> list[AddrInfo]:
    """The resolver's order, but with the first address of the other family second, so one
    broken family costs one delay, not one per address (RFC 6555 section 5.4)."""
    if not infos:
        return []
    first = infos[0]
    other = next((i for i, info in enumerate(infos) if info[0] != first[0]), None)
    if other is None:
        return list(infos)
    return [first, infos[other], *infos[1:other], *infos[other + 1 :]]


class ConnectTimedOut(TimeoutError):
    """No address answered within the connect timeout (or the name did not resolve in it)."""


async def open_tcp_stream(
    host: str, port: int, *, rcvbuf_bytes: int, connect_timeout_s: float = math.inf
) -> trio.SocketStream:
    """A connected stream to ``host:port`` whose ``SO_RCVBUF`` was set before its SYN. Raises
    ``OSError`` when no address connects, :class:`ConnectTimedOut` when none answered in time.

    ``connect_timeout_s`` bounds the name's resolution, and each attempt from the moment its
    SYN goes out: the upstream's part. The time the gateway's own loop takes to get to the
    attempt is not counted: a loop busy with a storm of arrivals (scenario D, 9,000 streams at
    once) took seconds to run each dial's next step, and 2,543 dials to the simulator on
    loopback, whose handshakes the kernel completes at once, failed as "connect timed out"
    under a deadline that had started before their SYN was sent."""
    with trio.move_on_after(connect_timeout_s) as resolving:
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if resolving.cancelled_caught:
        raise ConnectTimedOut(f"{host!r} did not resolve within {connect_timeout_s:g} s")
    targets = attempt_order(infos)
    if not targets:
        raise OSError(f"no address for {host!r}")
    connected: list[trio.socket.SocketType] = []
    errors: list[OSError] = []

    async def attempt(target: AddrInfo, failed: trio.Event, won: trio.CancelScope) -> None:
        family, kind, proto, _, address = target
        try:
            # Inside: at the descriptor limit the socket itself fails (EMFILE), and that must
            # reach the caller as the OSError it is, not as an exception group of the nursery.
            sock = trio.socket.socket(family, kind, proto)
        except OSError as exc:
            errors.append(exc)
            failed.set()
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
            with trio.move_on_after(connect_timeout_s) as waited:
                await sock.connect(address)  # closes the socket itself when cancelled
        except OSError as exc:
            sock.close()
            errors.append(exc)
            failed.set()
            return
        if waited.cancelled_caught:
            errors.append(ConnectTimedOut(f"no answer within {connect_timeout_s:g} s"))
            failed.set()
            return
        connected.append(sock)
        won.cancel()

    try:
        async with trio.open_nursery() as nursery:
            for target in targets:
                failed = trio.Event()
                nursery.start_soon(attempt, target, failed, nursery.cancel_scope)
                with trio.move_on_after(HAPPY_EYEBALLS_DELAY_S):
                    await failed.wait()
    except BaseException:
        # The caller's deadline can land after an attempt connected: nobody will use it.
        for sock in connected:
            sock.close()
        raise
    if not connected:
        exhausted = next((e for e in errors if is_exhaustion(e)), None)
        if exhausted is not None:
            raise exhausted  # the gateway's own limit, whatever the other attempts met
        if all(isinstance(e, ConnectTimedOut) for e in errors):
            raise errors[-1]
        if len(errors) == 1:
            raise errors[0]
        raise OSError(f"all attempts to connect to {host}:{port} failed: {errors[-1]}")
    # Two attempts can both connect before the first one's cancel lands: keep the first.
    for extra in connected[1:]:
        extra.close()
    return trio.SocketStream(connected[0])
