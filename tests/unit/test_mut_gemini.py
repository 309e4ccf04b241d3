"""Gemini's protobuf Duration (``retryDelay``) in both its JSON forms, by table.

Written for mutation testing (docs/testing.md): the dialect tests pass one typical value.
"""

from __future__ import annotations

import pytest

from trio_gateway.providers.gemini.errors import _duration_s


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("4s", 4.0),
        (" 1.5s ", 1.5),
        ("0s", 0.0),
        ("4", None),
        ("s", None),
        ("4ms", None),
        ("x4s", None),
        ({"seconds": 4}, 4.0),
        ({"seconds": "3", "nanos": 500_000_000}, 3.5),
        ({"nanos": 250_000_000}, 0.25),
        ({}, 0.0),
        ({"seconds": "x"}, None),
        ({"seconds": None}, None),
        ({"seconds": 1, "nanos": [1]}, None),
        (4, None),
        (None, None),
    ],
)
def test_duration(value: object, seconds: float | None) -> None:
    assert _duration_s(value) == seconds
