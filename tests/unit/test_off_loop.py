"""fronts/off_loop.py: a big body is read in a worker thread, never more than BODY_THREADS at
once however many arrive; a small one on the loop; the request's context goes with it; and the
worker hands the loop its turn between the pieces of a big text."""

from __future__ import annotations

import contextvars
import sys
import threading
from collections.abc import Callable

import trio

from trio_gateway.core import body
from trio_gateway.fronts.off_loop import (
    BODY_THREADS,
    OFF_LOOP_BODY_BYTES,
    WORKER_SWITCH_INTERVAL_S,
    _hand_over,
    body_limiter,
    off_loop,
)

BIG = OFF_LOOP_BODY_BYTES + 1
REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request")


async def test_a_small_body_is_read_on_the_loop_and_a_big_one_in_a_worker() -> None:
    loop = threading.get_ident()
    assert await off_loop(OFF_LOOP_BODY_BYTES, threading.get_ident) == loop
    assert await off_loop(BIG, threading.get_ident) != loop


async def test_many_big_bodies_at_once_take_at_most_body_threads_threads() -> None:
    lock = threading.Lock()
    running = 0
    most = 0
    release = threading.Event()

    def read() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(10)
        with lock:
            running -= 1

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(off_loop, BIG, read)
        with trio.fail_after(10):
            while body_limiter().statistics().tasks_waiting < 12 - BODY_THREADS:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert body_limiter().borrowed_tokens == BODY_THREADS
        release.set()
    assert most == BODY_THREADS


async def test_the_worker_reads_in_the_request_s_context_and_hands_the_loop_its_turn() -> None:
    REQUEST.set("r1")
    before = sys.getswitchinterval()

    def read() -> tuple[str, float, Callable[[], None]]:
        return REQUEST.get(), sys.getswitchinterval(), body.BETWEEN_PIECES.get()

    seen, interval, between = await off_loop(BIG, read)
    assert seen == "r1"
    assert interval == WORKER_SWITCH_INTERVAL_S
    assert between is _hand_over
    assert sys.getswitchinterval() == before
    # On the loop, nothing may sleep between pieces: the default does nothing.
    assert body.BETWEEN_PIECES.get()() is None
