"""``bench/profile_chunks.py``'s reading of py-spy's raw output (the run itself needs py-spy)."""

from __future__ import annotations

import pytest
from bench.profile_chunks import frame_key, inclusive_shares


def test_a_function_counts_once_per_stack_it_is_in() -> None:
    raw = "\n".join(
        [
            "main (/x/src/trio_gateway/cli/main.py:10);recurse (/y/site-packages/a/b.py:3);"
            "recurse (/y/site-packages/a/b.py:7) 3",
            "main (/x/src/trio_gateway/cli/main.py:12);leaf (/y/site-packages/c.py:1) 1",
            "not a sample line",
            "",
        ]
    )
    total, shares = inclusive_shares(raw)
    assert total == 4
    assert dict(shares) == {
        "main (trio_gateway/cli/main.py)": 1.0,
        "recurse (a/b.py)": pytest.approx(0.75),
        "leaf (c.py)": pytest.approx(0.25),
    }
    assert shares[0][0] == "main (trio_gateway/cli/main.py)"


def test_frames_and_nothing() -> None:
    assert frame_key("<native>") == "<native>"
    assert frame_key("f (/p/site-packages/h11/_state.py:9)") == "f (h11/_state.py)"
    assert inclusive_shares("") == (0, [])
