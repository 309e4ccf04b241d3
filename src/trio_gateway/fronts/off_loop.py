"""A big body is read off the event loop: parsed, checked, translated and screened by the input
filters in a worker thread, so that no other request (``/healthz`` included) waits for it.

A 4 MiB body of 130,000 text blocks held the loop for 1.9 s before it was refused, and the
input filters' scan of 4 MiB alone for 0.45 s: every request of the process waited. Past
:data:`OFF_LOOP_BODY_BYTES` a front hands its whole reading to a worker (``trio.to_thread``),
at most :data:`BODY_THREADS` at once (a limiter of this run's own: more bodies wait for a
thread, never make more of them). Python runs one thread at a time, so a worker still takes
the loop's turns; but it gives them back every few milliseconds (``sys.getswitchinterval``),
and the longest call that cannot be interrupted, msgspec's reading of a piece of the text, is
bounded by ``core/body.PIECE_BYTES``. Below the threshold the work costs less than the
thread's hand-off, and is done here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Final, TypeVar

import trio
from trio.lowlevel import RunVar

from trio_gateway.core.body import BETWEEN_PIECES

# A body past this is read in a worker thread. Below it, reading and checking it here takes
# at most some 6 to 9 ms, for the costliest shapes (2,400 tiny parts, 2,000 one-word messages:
# measured on a loaded 2-core machine), and well under 1 ms for a usual request.
OFF_LOOP_BODY_BYTES: Final = 64 * 1024
# Worker threads reading bodies at once, per process (one gateway worker of [server] workers;
# more processes are how the gateway uses more cores). One: Python runs one thread at a time,
# so a second reader would not read faster, only take more of the loop's turns; more big
# bodies wait for it (in arrival order), and only they do.
BODY_THREADS: Final = 1
# How often a thread that wants the GIL (the loop's, at each of its socket calls) may take it
# from a worker reading a body, instead of Python's 5 ms: a /healthz takes a few turns.
WORKER_SWITCH_INTERVAL_S: Final = 0.001
# How long a worker sleeps after each piece of a big text it read holding the GIL (at most a
# few per body; core/body.BETWEEN_PIECES): the loop's turn.
HAND_OVER_S: Final = 0.001

T = TypeVar("T")

_LIMITER: RunVar[trio.CapacityLimiter] = RunVar("body_limiter")


def body_limiter() -> trio.CapacityLimiter:
    """The bodies' threads of this trio run (one per process that serves)."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(BODY_THREADS)
        _LIMITER.set(limiter)
        return limiter


async def off_loop(size: int, read: Callable[[], T]) -> T:
    """``read()``, the reading of a body of ``size`` bytes: here when it is small, else in a
    worker thread. Not abandoned on cancellation (the work is bounded by the body's size):
    the request's context variables go with it, so its access line learns its alias."""
    if size <= OFF_LOOP_BODY_BYTES:
        return read()
    return await trio.to_thread.run_sync(_in_worker, read, limiter=body_limiter())


def _in_worker(read: Callable[[], T]) -> T:
    """``read()`` in a worker thread, handing the loop's thread its turn between the pieces of
    a big text (``core/body.BETWEEN_PIECES``), and, while it runs, the GIL every
    :data:`WORKER_SWITCH_INTERVAL_S` (the one worker at a time lets it set and restore
    Python's switch interval, a setting of the process)."""
    BETWEEN_PIECES.set(_hand_over)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(WORKER_SWITCH_INTERVAL_S)
    try:
        return read()
    finally:
        sys.setswitchinterval(previous)


def _hand_over() -> None:
    # A sleep, not a yield of the GIL alone: the worker is not runnable for that long, so the
    # loop's thread takes the GIL at once each time it needs it (each socket call gives it up).
    time.sleep(HAND_OVER_S)
