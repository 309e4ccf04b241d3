"""The shortcuts of request validation against the checks they skip: the same error (type,
message, ``param``), or none, for any body; and ``strict_loads`` against ``json.loads``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_validation import BODY, JSON, damaged, nested
from trio_gateway.core.errors import GatewayError
from trio_gateway.core.request import _no_constants, strict_loads
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


def loads_outcome(load: Callable[[], object]) -> tuple[str, object]:
    try:
        return ("value", load())
    except (ValueError, RecursionError) as exc:
        return (type(exc).__name__, str(exc))


TEXTS = st.one_of(
    JSON.map(json.dumps),
    st.text(max_size=20),
    st.sampled_from(["NaN", "[Infinity]", "\ufeff{}", '{"a": -Infinity}', "[1,", ""]),
)
RAW = st.one_of(
    TEXTS.map(str.encode),
    st.tuples(TEXTS, st.sampled_from(["utf-8-sig", "utf-16", "utf-16-le", "utf-32"])).map(
        lambda pair: pair[0].encode(pair[1])
    ),
    st.binary(max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(raw=TEXTS | RAW)
def test_strict_loads_reads_what_json_loads_reads(raw: str | bytes) -> None:
    expected = loads_outcome(lambda: json.loads(raw, parse_constant=_no_constants))
    if expected[0] == "RecursionError":
        expected = ("_NotJSON", "nested too deeply")
    assert loads_outcome(lambda: strict_loads(raw)) == expected


def test_nesting_past_the_parser_is_an_error_not_a_crash() -> None:
    assert loads_outcome(lambda: strict_loads("[" * 100_000)) == (
        "_NotJSON",
        "nested too deeply",
    )
