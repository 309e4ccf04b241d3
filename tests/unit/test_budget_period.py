"""Budget periods: UTC calendar days, ISO weeks from Monday, months; and none."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.core.budget_period import BUDGET_PERIODS, period_of, same_kind


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("kind", "at", "period_id", "start", "renews_at"),
    [
        ("day", "2026-12-03T23:59:59", "day:2026-12-03", "2026-12-03T00:00:00", "2026-12-04"),
        ("day", "2026-12-04T00:00:00", "day:2026-12-04", "2026-12-04T00:00:00", "2026-12-05"),
        # 2026-12-03 is a Thursday: its week began on Monday 30 November.
        ("week", "2026-12-03T12:00:00", "week:2026-11-30", "2026-11-30T00:00:00", "2026-12-07"),
        ("week", "2026-11-30T00:00:00", "week:2026-11-30", "2026-11-30T00:00:00", "2026-12-07"),
        ("week", "2026-11-29T23:59:59", "week:2026-11-23", "2026-11-23T00:00:00", "2026-11-30"),
        ("month", "2026-12-31T23:59:59", "month:2026-12-01", "2026-12-01T00:00:00", "2027-01-01"),
        ("month", "2028-02-29T10:00:00", "month:2028-02-01", "2028-02-01T00:00:00", "2028-03-01"),
        ("month", "2026-01-31T10:00:00", "month:2026-01-01", "2026-01-01T00:00:00", "2026-02-01"),
    ],
)
def test_calendar_periods_in_utc(
    kind: str, at: str, period_id: str, start: str, renews_at: str
) -> None:
    period = period_of(kind, ts(at))
    assert period.id == period_id
    assert period.start == ts(start)
    assert period.renews_at() == f"{renews_at}T00:00:00Z"
    assert period.end == ts(f"{renews_at}T00:00:00")
    assert period.renews_in_s(ts(at)) == period.end - ts(at)
    assert period.renews_in_s(period.end + 5) == 0.0


def test_none_is_the_keys_whole_life_and_never_renews() -> None:
    period = period_of("none", ts("2026-12-03T12:00:00"))
    assert period.id == "none"
    assert period.start == -math.inf
    assert period.end is None
    assert period.renews_at() is None
    assert period.renews_in_s(0.0) is None


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown budget period 'year'"):
        period_of("year", 0.0)


def test_ids_of_one_kind() -> None:
    assert same_kind("day:2026-12-03", "day:2026-12-04")
    assert not same_kind("day:2026-12-03", "week:2026-11-30")
    assert not same_kind("none", "day:2026-12-03")
    assert same_kind("none", "none")


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from([k for k in BUDGET_PERIODS if k != "none"]),
    at=st.floats(min_value=0, max_value=4_102_444_800),  # 1970 to 2100
)
def test_a_time_is_in_its_period_and_the_next_starts_where_it_ends(kind: str, at: float) -> None:
    period = period_of(kind, at)
    assert period.end is not None
    assert period.start <= at < period.end
    following = period_of(kind, period.end)
    assert following.start == period.end
    assert following.id > period.id  # ids of one kind sort as time does
    assert period_of(kind, period.start).id == period.id
