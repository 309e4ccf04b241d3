"""The simulator acts on a client's hang-up from whichever task looks (sim/shell.py), not only
from its watcher task, which at thousands of streams runs only after a burst of tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from tests.sockets import connected_pair
from trio_gateway.http1.hang_ups import TICKS_PER_POLL, HangUps
from trio_gateway.http1.server import HANG_UP_EXTENSION, SOCKET_FD_EXTENSION
from trio_gateway.sim import SimConfig, SimEngine
from trio_gateway.sim.shell import Shell, _Watch


class Sequence:
    def __init__(self) -> None:
        self.left = 0

    def mark_client_left(self) -> None:
        self.left += 1


@attrs.define
class Watched:
    hang_ups: HangUps
    peer: trio.SocketStream
    seq: Sequence
    watch: _Watch
    cancel: trio.CancelScope
    unwatch: Callable[[], None]


@asynccontextmanager
async def watched_answer() -> AsyncIterator[Watched]:
    """An answer of the simulator's shell watched through a served hang-up set, on a real
    connection whose client is ``peer``."""
    shell, hang_ups = Shell(SimEngine(SimConfig())), HangUps()
    async with trio.open_nursery() as nursery:
        await nursery.start(hang_ups.serve)
        peer, server_side = await connected_pair()
        fd = server_side.socket.fileno()
        scope = {"extensions": {HANG_UP_EXTENSION: hang_ups, SOCKET_FD_EXTENSION: fd}}
        seq, watch, cancel = Sequence(), _Watch(), trio.CancelScope()
        unwatch = shell._watch_hang_up(scope, [seq], watch, cancel)  # type: ignore[list-item]
        assert unwatch is not None
        yield Watched(hang_ups, peer, seq, watch, cancel, unwatch)
        unwatch()
        await server_side.aclose()
        nursery.cancel_scope.cancel()


async def test_a_hang_up_marks_the_sequence_and_ends_the_answer_at_the_next_look() -> None:
    async with watched_answer() as w:
        w.peer.socket.close()
        for _ in range(TICKS_PER_POLL):  # a burst of writes: no checkpoint in between
            w.hang_ups.tick()
        assert (w.seq.left, w.watch.client_left, w.cancel.cancel_called) == (1, True, True)


async def test_a_hang_up_after_the_answer_is_no_abort() -> None:
    async with watched_answer() as w:
        w.watch.done = True
        w.peer.socket.close()
        for _ in range(TICKS_PER_POLL):
            w.hang_ups.tick()
        assert (w.seq.left, w.watch.client_left, w.cancel.cancel_called) == (0, False, False)


def test_no_watch_without_the_server_s() -> None:
    shell = Shell(SimEngine(SimConfig()))
    no_watch = shell._watch_hang_up(
        {"extensions": {}},
        [Sequence()],  # type: ignore[list-item]
        _Watch(),
        trio.CancelScope(),
    )
    assert no_watch is None
