"""Which listed equivalent mutants need not run again: their mutated source is unchanged.

A listed equivalent mutant survives every test by nature, so each run spends on it every test
that reaches its function (about 40 s for one in ``Upstream`` or ``h1_client``; 13 of the
41 minutes of a whole run on 2 cores). Once a run has seen it survive, ``report.py --lock``
writes the fingerprint of its mutated function (mutmut's ``x_…__mutmut_N`` in ``mutants/src``)
to ``equivalent.lock``; a later run skips its tests while that source is byte for byte the same.
Any change to the function (or a new numbering of its mutants) changes the fingerprint, and
the mutant runs again, as if it had never been checked.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

LOCK = Path(__file__).with_name("equivalent.lock")
_NAME = re.compile(r"^(?P<module>[\w.]+?)\.(?P<function>x[_ǁ]\S*__mutmut_\d+)$")


def split_name(name: str) -> tuple[str, str] | None:
    """A mutant's name → its module and the name of its mutated function."""
    match = _NAME.match(name)
    return (match["module"], match["function"]) if match else None


def fingerprint(source: str, function: str) -> str | None:
    """The fingerprint of ``function``'s source in a mutated module, None if it is not there."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
            text = ast.get_source_segment(source, node) or ""
            return hashlib.sha256(text.encode()).hexdigest()[:16]
    return None


def fingerprint_of(name: str, src: Path) -> str | None:
    """``name``'s fingerprint in the mutated tree under ``src`` (``mutants/src``)."""
    parts = split_name(name)
    if parts is None:
        return None
    path = src.joinpath(*parts[0].split(".")).with_suffix(".py")
    if not path.exists():
        return None
    return fingerprint(path.read_text(encoding="utf-8"), parts[1])


def read_lock(path: Path = LOCK) -> dict[str, str]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {str(k): str(v) for k, v in data.items()}


def write_lock(lock: dict[str, str], path: Path = LOCK) -> None:
    text = json.dumps(dict(sorted(lock.items())), indent=1, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
