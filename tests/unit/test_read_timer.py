"""The upstream read deadline: a watcher per upstream (or per stream) instead of a cancel scope
per read."""

from __future__ import annotations

import math

import trio
import trio.testing

from trio_gateway.providers.read_timer import ReadDeadlines, ReadTimer


async def _reads(timer: ReadTimer, gaps: list[float], emit_s: float = 0.0) -> int:
    """Reads that each wait ``gap`` for data, with ``emit_s`` spent handing each on; returns
    how many completed before the timer cut them."""
    done = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timer.watch)
        with timer.scope:
            for gap in gaps:
                timer.reading()
                await trio.sleep(gap)
                timer.read_done()
                timer.started = True
                done += 1
                await trio.sleep(emit_s)
        nursery.cancel_scope.cancel()
    return done


async def test_reads_within_the_idle_deadline_are_never_cut(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timer = ReadTimer(first_deadline=trio.current_time() + 5, idle_s=2.0)
    assert await _reads(timer, [4.9, 1.99, 1.99, 1.0, 1.99]) == 5
    assert timer.expired is None and not timer.scope.cancelled_caught


async def test_a_read_past_the_idle_deadline_is_cut_at_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    timer = ReadTimer(first_deadline=start + 5, idle_s=2.0)
    assert await _reads(timer, [1.0, 1.5, 10.0]) == 2
    assert timer.expired == "idle"
    # Cut exactly idle_s after the third read began, not at the watcher's next routine wake.
    assert trio.current_time() - start == 1.0 + 1.5 + 2.0


async def test_the_first_token_deadline_runs_from_the_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    timer = ReadTimer(first_deadline=start + 3, idle_s=60.0)
    assert await _reads(timer, [10.0]) == 0
    assert timer.expired == "first" and trio.current_time() - start == 3


async def test_time_spent_handing_events_on_is_not_idleness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A slow client holds each event for 5 s, longer than idle_s: the client stall deadline's
    # business, not the upstream's.
    timer = ReadTimer(first_deadline=trio.current_time() + 5, idle_s=2.0)
    assert await _reads(timer, [1.0, 1.0, 1.0], emit_s=5.0) == 3
    assert timer.expired is None


def test_due() -> None:
    timer = ReadTimer(first_deadline=7.0, idle_s=2.0)
    assert timer.due() == 7.0  # before the first event, whatever the reads
    timer.started = True
    assert timer.due() == math.inf  # not reading
    timer.read_since = 10.0
    assert timer.due() == 12.0


# --- one keeper for every stream of an upstream ------------------------------------------------


async def _kept_reads(
    deadlines: ReadDeadlines, timer: ReadTimer, gaps: list[float], cut_at: list[float]
) -> None:
    with timer.scope, deadlines.keeping(timer):
        for gap in gaps:
            timer.reading()
            await trio.sleep(gap)
            timer.read_done()
            timer.started = True
    if timer.scope.cancelled_caught:
        cut_at.append(trio.current_time())


async def test_one_keeper_cuts_each_stream_exactly_at_its_own_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    deadlines = ReadDeadlines()
    start = trio.current_time()
    cuts: dict[str, list[float]] = {}
    streams = {
        "fine": (ReadTimer(first_deadline=start + 5, idle_s=2.0), [1.0, 1.9, 1.9, 1.9]),
        "idle": (ReadTimer(first_deadline=start + 5, idle_s=2.0), [1.0, 1.5, 10.0]),
        "first": (ReadTimer(first_deadline=start + 3, idle_s=60.0), [10.0]),
        "late idle": (ReadTimer(first_deadline=start + 5, idle_s=0.5), [0.4] * 10 + [9.0]),
    }
    async with trio.open_nursery() as nursery:
        await nursery.start(deadlines.serve)
        assert deadlines.running
        async with trio.open_nursery() as streams_nursery:
            for name, (timer, gaps) in streams.items():
                streams_nursery.start_soon(
                    _kept_reads, deadlines, timer, gaps, cuts.setdefault(name, [])
                )
        assert len(deadlines) == 0  # every stream left
        nursery.cancel_scope.cancel()
    assert not deadlines.running
    assert cuts["fine"] == [] and streams["fine"][0].expired is None
    assert cuts["idle"] == [start + 1.0 + 1.5 + 2.0] and streams["idle"][0].expired == "idle"
    assert cuts["first"] == [start + 3] and streams["first"][0].expired == "first"
    assert cuts["late idle"] == [start + 4.0 + 0.5]


async def test_a_stream_added_with_an_earlier_deadline_wakes_the_keeper(
    autojump_clock: trio.testing.MockClock,
) -> None:
    deadlines = ReadDeadlines()
    start = trio.current_time()
    far: list[float] = []
    near: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(deadlines.serve)
        far_timer = ReadTimer(first_deadline=start + 100, idle_s=1000.0)
        nursery.start_soon(_kept_reads, deadlines, far_timer, [500.0], far)
        await trio.sleep(1.0)  # the keeper now sleeps until 100 s
        near_timer = ReadTimer(first_deadline=start + 3, idle_s=1000.0)
        await _kept_reads(deadlines, near_timer, [500.0], near)
        assert near == [start + 3]  # not at 100 s: the add moved the keeper's wake
        await trio.sleep(200)
        assert far == [start + 100]
        nursery.cancel_scope.cancel()
