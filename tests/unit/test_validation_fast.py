"""The shortcuts of request validation against the checks they skip: the same error (type,
message, ``param``), or none, for any body. (The reader against ``json.loads``: test_body.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_validation import BODY, damaged, nested
from trio_gateway.core.errors import GatewayError
from trio_gateway.core.validation import (
    CROSS_CHECKS,
    FIELD_CHECKS,
    _depth,
    _message,
    validate_body,
    within_depth,
)
from trio_gateway.core.validation_values import array, optional_fields, required


def outcome(check: Callable[[], object]) -> tuple[str, str, str | None] | None:
    try:
        check()
    except GatewayError as exc:
        return type(exc).__name__, exc.message, exc.param
    return None


def every_check(body: Any) -> None:
    """validate_body as it was: the depth walked, every message and every field of the
    table checked in full."""
    _depth(body)
    for i, message in enumerate(array("messages", required(body, "messages", ""), min_items=1)):
        _message(f"messages[{i}]", message)
    optional_fields("", body, FIELD_CHECKS)
    for check in CROSS_CHECKS:
        check(body)


DEEP = st.integers(min_value=25, max_value=40).map(
    lambda wraps: {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "x": nested(wraps),
    }
)


@settings(max_examples=400, deadline=None)
@given(body=damaged() | BODY | DEEP)
def test_the_shortcuts_raise_what_every_check_raises(body: dict[str, Any]) -> None:
    text = json.dumps(body).encode()
    expected = outcome(lambda: every_check(body))
    assert outcome(lambda: validate_body(body, depth_known=within_depth(text))) == expected
    assert outcome(lambda: validate_body(body)) == expected


@given(body=DEEP)
def test_a_body_past_the_depth_is_never_taken_for_within(body: dict[str, Any]) -> None:
    if outcome(lambda: _depth(body)) is not None:
        assert not within_depth(json.dumps(body).encode())
        assert not within_depth(json.dumps(body).encode("utf-16"))
