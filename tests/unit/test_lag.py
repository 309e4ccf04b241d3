"""LagMeter: the age of the oldest byte a client has not taken, from below, against a model that
knows every byte's write time."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.ops.lag import LagMeter

EVERY_S = 0.25


@attrs.define
class Model:
    """Every write's byte range and time; ``acked`` bytes taken by the client."""

    writes: list[tuple[int, int, float]] = attrs.field(factory=list)  # start, end, time
    written: int = 0
    acked: int = 0

    def age(self, now: float) -> float:
        if self.acked == self.written:
            return 0.0
        for start, end, at in self.writes:
            if start <= self.acked < end:
                return now - at
        raise AssertionError("unreachable")


ops = st.lists(
    st.one_of(
        st.tuples(st.just("advance"), st.floats(min_value=0.0, max_value=EVERY_S)),
        st.tuples(st.just("write"), st.integers(min_value=1, max_value=5000)),
        st.tuples(st.just("ack"), st.floats(min_value=0.0, max_value=1.0)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_bound_is_never_above_the_true_age_and_at_most_two_intervals_below(
    steps: list[tuple[str, float]],
) -> None:
    meter = LagMeter(mark_every_s=EVERY_S, max_marks=10_000)
    model = Model()
    now = 0.0
    for op, value in steps:
        if op == "advance":
            now += value
        elif op == "write":
            n = int(value)
            model.writes.append((model.written, model.written + n, now))
            model.written += n
            meter.written += n
        else:
            # The client takes a share of what is waiting (acknowledgements only move forward).
            model.acked += int((model.written - model.acked) * value)
        bound = meter.sample(now, model.written - model.acked)
        true_age = model.age(now)
        assert bound <= true_age + 1e-9
        # Sampled after every step, steps at most one interval apart: the mark after a byte's
        # write is at most two intervals later.
        assert bound >= true_age - 2 * EVERY_S - 1e-9
        assert len(meter) <= 1 + (now / EVERY_S) + 1


@settings(max_examples=100, deadline=None)
@given(ops, st.integers(min_value=1, max_value=4))
def test_dropping_old_marks_only_loosens_the_bound(
    steps: list[tuple[str, float]], max_marks: int
) -> None:
    loose = LagMeter(mark_every_s=EVERY_S, max_marks=max_marks)
    model = Model()
    now = 0.0
    for op, value in steps:
        if op == "advance":
            now += value
        elif op == "write":
            model.writes.append((model.written, model.written + int(value), now))
            model.written += int(value)
            loose.written += int(value)
        else:
            model.acked += int((model.written - model.acked) * value)
        assert loose.sample(now, model.written - model.acked) <= model.age(now) + 1e-9
        assert len(loose) <= max_marks


def test_a_client_that_takes_nothing_falls_behind_by_the_time_since_its_first_byte() -> None:
    meter = LagMeter(mark_every_s=EVERY_S, max_marks=100)
    assert meter.sample(0.0, 0) == 0.0
    meter.written = 100
    # Not due yet: this byte's write is known only from the next mark on.
    assert meter.sample(0.1, 100) == 0.0
    assert meter.sample(0.3, 100) == 0.0  # the first mark: nothing is known to be older
    for i in range(1, 41):
        meter.written += 100
        now = 0.3 + i * EVERY_S
        assert meter.sample(now, meter.written) == pytest.approx(now - 0.3)


def test_a_client_that_catches_up_is_not_behind_and_starts_again() -> None:
    meter = LagMeter(mark_every_s=EVERY_S, max_marks=100)
    meter.written = 1000
    meter.sample(0.0, 1000)
    assert meter.sample(5.0, 1000) == 5.0
    assert meter.sample(5.1, 0) == 0.0
    assert len(meter) == 0
    meter.written += 10
    assert meter.sample(10.0, 10) == 0.0
    assert meter.sample(12.0, 10) == 2.0


def test_a_count_past_what_was_written_is_clamped() -> None:
    meter = LagMeter(mark_every_s=EVERY_S, max_marks=100)
    meter.written = 10
    meter.sample(0.0, 10)
    assert meter.sample(3.0, 10**9) == 3.0
    assert meter.sample(3.5, -5) == 0.0


def test_marks_are_taken_at_most_once_an_interval() -> None:
    meter = LagMeter(mark_every_s=EVERY_S, max_marks=100)
    for i in range(100):
        meter.written += 1
        meter.sample(i * 0.01, meter.written)  # 1 s in all, nothing taken
    assert len(meter) == 4
    assert meter.due(1.0) and not meter.due(0.99)
