"""The lanes of a Responses WebSocket (``fronts/responses/lanes.py``): FIFO within a lane,
lanes beside each other up to ``max_lanes``, the waiting creates within ``max_queued_bytes``;
a table of cases, then a property against a model of the rules."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_gateway.fronts.responses.lanes import MIN_ITEM_BYTES, Lane, Lanes, Verdict

KIB = 1024


def test_a_lane_answers_one_create_at_a_time_in_order() -> None:
    lanes: Lanes[str] = Lanes(max_lanes=2, max_queued_bytes=10 * KIB)
    assert lanes.submit("a", "a1", 10) is Verdict.START
    assert lanes.submit("a", "a2", 10) is Verdict.QUEUED
    assert lanes.submit("a", "a3", 10) is Verdict.QUEUED
    assert lanes.finish("a") == "a2"
    assert lanes.finish("a") == "a3"
    assert lanes.finish("a") is None
    assert not lanes.busy and not lanes.answering("a")


def test_no_stream_id_is_one_default_lane() -> None:
    lanes: Lanes[str] = Lanes(max_lanes=2, max_queued_bytes=10 * KIB)
    assert lanes.submit(None, "1", 10) is Verdict.START
    assert lanes.submit(None, "2", 10) is Verdict.QUEUED
    assert lanes.submit("x", "3", 10) is Verdict.START  # another lane: beside it
    assert lanes.finish(None) == "2"


@pytest.mark.parametrize(
    ("submits", "expected"),
    [
        # (lane, size) in order; the verdict of the last.
        ([("a", 10), ("b", 10), ("c", 10)], Verdict.TOO_MANY_LANES),
        ([("a", 10), ("b", 10), ("a", 10)], Verdict.QUEUED),
        # Waiting creates within 3 KiB: a 1-byte message counts a whole KiB.
        ([("a", 1), ("a", 1), ("a", 1), ("a", 1)], Verdict.QUEUED),
        ([("a", 1), ("a", 1), ("a", 1), ("a", 1), ("a", 1)], Verdict.QUEUE_FULL),
        ([("a", 1), ("a", 3 * KIB)], Verdict.QUEUED),
        ([("a", 1), ("a", 3 * KIB + 1)], Verdict.QUEUE_FULL),
        # The answering create holds no queue bytes; a refused one holds none either.
        ([("a", 9 * KIB), ("a", 3 * KIB + 1), ("a", 3 * KIB)], Verdict.QUEUED),
    ],
)
def test_bounds(submits: list[tuple[Lane, int]], expected: Verdict) -> None:
    lanes: Lanes[int] = Lanes(max_lanes=2, max_queued_bytes=3 * KIB)
    verdicts = [lanes.submit(lane, i, size) for i, (lane, size) in enumerate(submits)]
    assert verdicts[-1] is expected


def test_a_lane_that_ends_frees_its_place() -> None:
    lanes: Lanes[str] = Lanes(max_lanes=1, max_queued_bytes=10 * KIB)
    assert lanes.submit("a", "a1", 1) is Verdict.START
    assert lanes.submit("b", "b1", 1) is Verdict.TOO_MANY_LANES
    assert lanes.finish("a") is None
    assert lanes.submit("b", "b1", 1) is Verdict.START


def test_take_queued_empties_every_lane_but_leaves_them_answering() -> None:
    lanes: Lanes[str] = Lanes(max_lanes=3, max_queued_bytes=10 * KIB)
    for lane, item in (("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2"), ("a", "a3")):
        lanes.submit(lane, item, 100)
    assert lanes.take_queued() == [("a", "a2"), ("a", "a3"), ("b", "b2")]
    stats = lanes.statistics()
    assert (stats.lanes, stats.queued, stats.queued_bytes) == (2, 0, 0)
    assert lanes.finish("a") is None and lanes.finish("b") is None


class Model:
    """The rules, written plainly: what each lane runs and holds."""

    def __init__(self, max_lanes: int, max_queued_bytes: int) -> None:
        self.max_lanes, self.max_queued_bytes = max_lanes, max_queued_bytes
        self.running: dict[Lane, int] = {}
        self.waiting: dict[Lane, deque[tuple[int, int]]] = {}

    def queued_bytes(self) -> int:
        return sum(max(size, MIN_ITEM_BYTES) for q in self.waiting.values() for _, size in q)

    def submit(self, lane: Lane, item: int, size: int) -> Verdict:
        if lane not in self.running:
            if len(self.running) >= self.max_lanes:
                return Verdict.TOO_MANY_LANES
            self.running[lane] = item
            self.waiting[lane] = deque()
            return Verdict.START
        if self.queued_bytes() + max(size, MIN_ITEM_BYTES) > self.max_queued_bytes:
            return Verdict.QUEUE_FULL
        self.waiting[lane].append((item, size))
        return Verdict.QUEUED

    def finish(self, lane: Lane) -> int | None:
        if not self.waiting[lane]:
            del self.running[lane], self.waiting[lane]
            return None
        item, _ = self.waiting[lane].popleft()
        self.running[lane] = item
        return item


LANES = st.sampled_from([None, "a", "b", "c"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), LANES, st.integers(0, 4 * KIB)),
        st.tuples(st.just("finish"), LANES, st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, max_lanes=st.integers(1, 3), max_queued_kib=st.integers(1, 8))
def test_lanes_follow_the_model(
    ops: list[tuple[str, Lane, int]], max_lanes: int, max_queued_kib: int
) -> None:
    lanes: Lanes[int] = Lanes(max_lanes=max_lanes, max_queued_bytes=max_queued_kib * KIB)
    model = Model(max_lanes, max_queued_kib * KIB)
    started: dict[Lane, list[int]] = {}
    submitted: dict[Lane, list[int]] = {}
    for item, (op, lane, size) in enumerate(ops):
        if op == "submit":
            verdict = lanes.submit(lane, item, size)
            assert verdict is model.submit(lane, item, size)
            if verdict in (Verdict.START, Verdict.QUEUED):
                submitted.setdefault(lane, []).append(item)
            if verdict is Verdict.START:
                started.setdefault(lane, []).append(item)
        elif lanes.answering(lane):
            following = lanes.finish(lane)
            assert following == model.finish(lane)
            if following is not None:
                started.setdefault(lane, []).append(following)
        stats = lanes.statistics()
        assert stats.lanes == len(model.running) <= max_lanes
        assert stats.queued_bytes == model.queued_bytes() <= max_queued_kib * KIB
    # FIFO: every lane started its accepted creates in the order they came.
    for lane, items in started.items():
        assert items == submitted[lane][: len(items)]
