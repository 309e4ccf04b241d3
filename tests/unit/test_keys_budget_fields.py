"""The keys file's budget_period and admin: parsed strictly, every problem with its path."""

from __future__ import annotations

import pytest

from tests.unit.test_auth import ALICE, BOB, entry, problems
from trio_gateway.core.keys import parse_keys


@pytest.mark.parametrize("period", ["day", "week", "month", "none"])
def test_a_budget_period_parses(period: str) -> None:
    ring = parse_keys(entry("alice", ALICE, f'budget = 5.0\nbudget_period = "{period}"'))
    alice = ring.lookup(ALICE)
    assert alice is not None and alice.budget_period == period


def test_without_a_period_a_budget_is_for_the_keys_whole_life_and_no_key_is_admin() -> None:
    ring = parse_keys(entry("alice", ALICE, "budget = 5.0") + entry("bob", BOB, "admin = true"))
    alice, bob = ring.lookup(ALICE), ring.lookup(BOB)
    assert alice is not None and alice.budget_period == "none" and alice.admin is False
    assert bob is not None and bob.admin is True


def test_bad_periods_and_admin_flags_are_named_with_their_path() -> None:
    text = (
        entry("alice", ALICE, 'budget = 5\nbudget_period = "year"\nadmin = "yes"')
        + entry("bob", BOB, 'budget_period = "day"\nadmin = 1')
        + entry("carol", "tgw-carol", "budget = 1\nbudget_period = 7")
    )
    assert problems(text) == [
        "keys.alice.budget_period: expected one of day, week, month, none, got 'year'",
        "keys.alice.admin: expected true or false, got 'yes'",
        "keys.bob.budget_period: only with a budget (a period of nothing renews nothing)",
        "keys.bob.admin: expected true or false, got 1",
        "keys.carol.budget_period: expected one of day, week, month, none, got 7",
    ]
