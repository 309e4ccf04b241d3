"""Every source path the docs name exists: a newcomer who opens one finds it.

A path in backticks that ends in ``.py`` is looked up from the repository root, then under
``src/trio_gateway/`` (the docs name modules by their place in the package). A record of the
past may name a file that has since moved, if it says where it went: "`old.py` (now `new.py`)".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "trio_gateway"
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
_PATH = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.py)`(?! \(now `)")
# Python files the docs mention that are not in this repository:
ELSEWHERE = frozenset({"agent.py", "parser/abstract_parser.py"})  # a user's script; vLLM's source


def missing_paths(text: str, root: Path) -> list[str]:
    """The ``.py`` paths in ``text`` that exist neither from the root, nor in the package, nor
    (for a bare name) anywhere in the repository."""
    names = {path.name for path in root.rglob("*.py") if ".venv" not in path.parts}
    missing = []
    for match in _PATH.finditer(text):
        path = match.group(1)
        if path in ELSEWHERE or (root / path).is_file() or (PACKAGE / path).is_file():
            continue
        if "/" not in path and path in names:
            continue
        missing.append(path)
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    assert missing_paths(doc.read_text(encoding="utf-8"), ROOT) == []


def test_a_moved_file_is_found_and_a_record_of_the_past_may_say_where_it_went() -> None:
    text = "`fronts/gone.py`, `http1/server.py`, `tests/unit/test_doc_paths.py`, `nowhere.py`"
    assert missing_paths(text, ROOT) == ["fronts/gone.py", "nowhere.py"]
    assert missing_paths("`fronts/gone.py` (now `http1/server.py`)", ROOT) == []
