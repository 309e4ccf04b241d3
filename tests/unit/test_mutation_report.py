"""The list of equivalent mutants in docs/testing.md, as ``tools/mutation/report.py`` reads it.

``make mutation`` is not part of ``make test``, but the list it scores against lives in the docs,
where an edit could break it without anyone running the mutation tool: these keep it readable.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli
from tools.mutation.fingerprint import fingerprint, read_lock, split_name, write_lock
from tools.mutation.report import EQUIVALENT, MARKER, ListError, merged_lock, parse_equivalent

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_list_parses_and_names_mutated_modules_only() -> None:
    equivalent = parse_equivalent(EQUIVALENT.read_text(encoding="utf-8"), str(EQUIVALENT))
    assert len(equivalent) >= 100
    config = tomli.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mutated = {
        path.removeprefix("src/").removesuffix(".py").replace("/", ".")
        for path in config["tool"]["mutmut"]["only_mutate"]
    }
    for name, reason in equivalent.items():
        module = name.split(".x", 1)[0]
        assert module in mutated, f"{name}: its module is not mutated"
        assert len(reason) >= 10, f"{name}: a reason, not a word"


def block(*lines: str) -> str:
    return "\n".join(["# Page", "", MARKER, "```text", *lines, "```", "after"])


def test_entries_and_blank_lines() -> None:
    text = block("a.x_f__mutmut_1  # same bytes", "", "a.x_g__mutmut_2  # # in a reason")
    assert parse_equivalent(text) == {
        "a.x_f__mutmut_1": "same bytes",
        "a.x_g__mutmut_2": "# in a reason",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no marker here", "no line"),
        (f"{MARKER}\nnot a block", "followed by a ```text block"),
        (f"{MARKER}\n```text\na.x_f__mutmut_1  # why", "not closed"),
        (block("a.x_f__mutmut_1"), r"<list>:5: a\.x_f__mutmut_1 has no reason"),
        (block("a.x_f__mutmut_1  #   "), "has no reason"),
        (block("a.x_f__mutmut_1  # why", "a.x_f__mutmut_1  # again"), ":6: .* listed twice"),
        (block("a.x_f  # why"), "not a mutant's name"),
        (block("a.x_f__mutmut_1 b  # why"), "not a mutant's name"),
    ],
)
def test_mistakes_in_the_list_are_named_with_their_line(text: str, message: str) -> None:
    with pytest.raises(ListError, match=message):
        parse_equivalent(text)


MUTATED = """
def x_f__mutmut_1(a):
    return a + 2

class C:
    def xǁCǁg__mutmut_3(self):
        return 1
"""


def test_a_mutant_s_name_gives_its_module_and_function() -> None:
    assert split_name("trio_gateway.providers.h1.xǁChunkedBodyǁfeed__mutmut_12") == (
        "trio_gateway.providers.h1",
        "xǁChunkedBodyǁfeed__mutmut_12",
    )
    assert split_name("trio_gateway.core.sse.x_json_data__mutmut_1") == (
        "trio_gateway.core.sse",
        "x_json_data__mutmut_1",
    )
    assert split_name("not a mutant") is None


def test_a_fingerprint_follows_the_mutated_source_only() -> None:
    first = fingerprint(MUTATED, "x_f__mutmut_1")
    method = fingerprint(MUTATED, "xǁCǁg__mutmut_3")
    assert first is not None and method is not None and first != method
    # Another function changing leaves it; its own source changing does not.
    assert fingerprint(MUTATED.replace("return 1", "return 2"), "x_f__mutmut_1") == first
    assert fingerprint(MUTATED.replace("a + 2", "a + 3"), "x_f__mutmut_1") != first
    assert fingerprint(MUTATED, "x_f__mutmut_2") is None


def test_the_lock_round_trips_and_names_listed_mutants(tmp_path: Path) -> None:
    path = tmp_path / "equivalent.lock"
    assert read_lock(path) == {}
    write_lock({"a.xǁCǁg__mutmut_3": "ab", "a.x_f__mutmut_1": "cd"}, path)
    assert read_lock(path) == {"a.x_f__mutmut_1": "cd", "a.xǁCǁg__mutmut_3": "ab"}
    listed = parse_equivalent(EQUIVALENT.read_text(encoding="utf-8"))
    assert set(read_lock()) <= set(listed), "equivalent.lock names a mutant no longer listed"


def test_locking_one_part_keeps_the_entries_of_the_others() -> None:
    listed = {"a.x_f__mutmut_1": "why", "b.x_g__mutmut_2": "why", "b.x_h__mutmut_3": "why"}
    lock = {"a.x_f__mutmut_1": "old-a", "b.x_g__mutmut_2": "old-b", "c.x_gone__mutmut_4": "x"}
    # This run checked b's mutants only (a's are another part, or were left unchecked).
    decided = {"b.x_g__mutmut_2", "b.x_h__mutmut_3"}
    survived = {"b.x_h__mutmut_3": "new-h"}
    assert merged_lock(lock, listed, decided, survived) == {
        "a.x_f__mutmut_1": "old-a",  # kept: not checked by this run
        "b.x_h__mutmut_3": "new-h",  # b.x_g was checked and did not survive: dropped
    }
