"""The simulator acts on a client's hang-up from whichever task looks (sim/shell.py), not only
from its watcher task, which at thousands of streams runs only after a burst of tokens."""

from __future__ import annotations

import trio

from trio_gateway.fronts.h1_serve import (
    HANG_UP_EXTENSION,
    SOCKET_FD_EXTENSION,
    TICKS_PER_POLL,
    HangUps,
)
from trio_gateway.sim import SimConfig, SimEngine
from trio_gateway.sim.shell import Shell, _Watch


class Sequence:
    def __init__(self) -> None:
        self.left = 0

    def mark_client_left(self) -> None:
        self.left += 1


async def hung_up_pair(hang_ups: HangUps) -> tuple[trio.SocketStream, trio.SocketStream]:
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listener:
        peer = await trio.open_tcp_stream("127.0.0.1", listener.socket.getsockname()[1])
        server_side = await listener.accept()
    return server_side, peer


async def test_a_hang_up_marks_the_sequence_and_ends_the_answer_at_the_next_look() -> None:
    shell, hang_ups = Shell(SimEngine(SimConfig())), HangUps()
    async with trio.open_nursery() as nursery:
        await nursery.start(hang_ups.serve)
        server_side, peer = await hung_up_pair(hang_ups)
        scope = {
            "extensions": {
                HANG_UP_EXTENSION: hang_ups,
                SOCKET_FD_EXTENSION: server_side.socket.fileno(),
            }
        }
        seq, watch, cancel = Sequence(), _Watch(), trio.CancelScope()
        unwatch = shell._watch_hang_up(scope, seq, watch, cancel)  # type: ignore[arg-type]
        assert unwatch is not None
        peer.socket.close()
        for _ in range(TICKS_PER_POLL):  # a burst of writes: no checkpoint in between
            hang_ups.tick()
        assert (seq.left, watch.client_left, cancel.cancel_called) == (1, True, True)
        unwatch()
        await server_side.aclose()
        nursery.cancel_scope.cancel()


async def test_a_hang_up_after_the_answer_is_no_abort_and_no_watch_without_the_server_s() -> None:
    shell, hang_ups = Shell(SimEngine(SimConfig())), HangUps()
    async with trio.open_nursery() as nursery:
        await nursery.start(hang_ups.serve)
        server_side, peer = await hung_up_pair(hang_ups)
        scope = {
            "extensions": {
                HANG_UP_EXTENSION: hang_ups,
                SOCKET_FD_EXTENSION: server_side.socket.fileno(),
            }
        }
        seq, watch, cancel = Sequence(), _Watch(), trio.CancelScope()
        unwatch = shell._watch_hang_up(scope, seq, watch, cancel)  # type: ignore[arg-type]
        assert unwatch is not None
        watch.done = True
        peer.socket.close()
        for _ in range(TICKS_PER_POLL):
            hang_ups.tick()
        assert (seq.left, watch.client_left, cancel.cancel_called) == (0, False, False)
        await server_side.aclose()
        nursery.cancel_scope.cancel()
    assert shell._watch_hang_up({"extensions": {}}, seq, watch, cancel) is None  # type: ignore[arg-type]
