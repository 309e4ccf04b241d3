"""A key's budget period: the UTC calendar day, ISO week (from Monday), or month it spends in,
or its whole life. Pure: a wall-clock time in, the period it falls in out.

A request counts in the period it started in (its usage record's ``started_at``): the stores
(accounting/limit_store.py) settle it there, and the ledger rebuilds a period's spend by the
same rule, so both agree to the nano.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, get_args

import attrs

BudgetPeriod = Literal["day", "week", "month", "none"]
BUDGET_PERIODS: Final[tuple[str, ...]] = get_args(BudgetPeriod)
NO_PERIOD: Final = "none"


@attrs.frozen(kw_only=True)
class Period:
    """One period of a budget: ``[start, end)`` in seconds since the epoch (UTC); ``end`` None
    for ``none`` (a budget for the key's whole life, which never renews)."""

    kind: str
    start: float
    end: float | None
    # Names the period where it is kept: the Redis key's suffix, the in-process store's state.
    # "day:2026-12-03", "week:2026-11-30" (its Monday), "month:2026-12-01"; "none".
    id: str

    def renews_in_s(self, now: float) -> float | None:
        """Seconds until the budget is whole again; None when it never renews."""
        return None if self.end is None else max(0.0, self.end - now)

    def renews_at(self) -> str | None:
        """When the next period starts, as ISO 8601 in UTC (``2026-12-04T00:00:00Z``)."""
        if self.end is None:
            return None
        return datetime.fromtimestamp(self.end, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# A budget for the key's whole life: one period, from ever to never.
LIFETIME: Final = Period(kind=NO_PERIOD, start=-math.inf, end=None, id=NO_PERIOD)


def period_of(kind: str, at: float) -> Period:
    """The period of ``kind`` that the wall-clock time ``at`` (seconds since the epoch) is in."""
    if kind == NO_PERIOD:
        return LIFETIME
    # Whole seconds: periods begin on one, and fromtimestamp would round 23:59:59.9999995 up
    # into the next day.
    moment = datetime.fromtimestamp(math.floor(at), UTC)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == "day":
        start, end = day, day + timedelta(days=1)
    elif kind == "week":
        start = day - timedelta(days=day.weekday())  # Monday, as ISO 8601 weeks begin
        end = start + timedelta(days=7)
    elif kind == "month":
        start = day.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"unknown budget period {kind!r} (known: {', '.join(BUDGET_PERIODS)})")
    return Period(
        kind=kind,
        start=start.timestamp(),
        end=end.timestamp(),
        id=f"{kind}:{start.date().isoformat()}",
    )


def same_kind(period_id: str, other_id: str) -> bool:
    """Whether two period ids are of one kind (``day:...`` and ``day:...``)."""
    return period_id.partition(":")[0] == other_id.partition(":")[0]
