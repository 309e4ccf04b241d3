"""The mutation score of the last `mutmut run`: killed / (total - equivalent).

Reads mutmut's results (``mutants/**/*.py.meta``) and the equivalent mutants listed in
``docs/testing.md`` ("Equivalent mutants": a ``text`` block after the marker line, one
``mutant-name  # reason`` a line): the list the issue asks to keep in the docs is the one the
score uses, so the two cannot differ. A survivor that is neither killed nor listed is printed
with its name, so ``mutmut show NAME`` tells what it is.

    .venv/bin/python tools/mutation/report.py [--min-score 90] [--only PREFIX ...]

``--only`` keeps the mutants whose name starts with one of the prefixes (``make mutation-core``
and ``make mutation-providers`` each report their own part: the other part is not checked).

Exit status 1 when the score is under ``--min-score``, or when the equivalent list names a
mutant that no longer exists or that a test now kills (the list must not go stale).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

if not __package__:  # run as a script (the Makefile's way): make `tools` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.mutation.fingerprint import fingerprint_of, read_lock, write_lock

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENT = ROOT / "docs" / "testing.md"
MARKER = "<!-- equivalent mutants: read by tools/mutation/report.py -->"

# mutmut 3's exit codes (mutmut/stats.py): a failing test run, a timeout (a mutant that turns a
# loop endless) and a type-check failure all kill; a passing run is a survivor.
KILLED = {1: "killed", 3: "killed", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout"}
KILLED |= {255: "timeout", 37: "type check"}
SURVIVED = {0: "survived", 5: "no tests", 33: "no tests", 34: "skipped"}


class ListError(Exception):
    """The list of equivalent mutants is missing, or an entry has no reason or is repeated."""


def listed_lines(text: str) -> list[tuple[int, str]]:
    """The lines (numbered in the file) of the fenced block that follows the marker line."""
    lines = text.splitlines()
    try:
        start = lines.index(MARKER)
    except ValueError:
        raise ListError(f"no line {MARKER!r}") from None
    if lines[start + 1 : start + 2] != ["```text"]:
        raise ListError("the marker line must be followed by a ```text block")
    block: list[tuple[int, str]] = []
    for number, line in enumerate(lines[start + 2 :], start + 3):
        if line == "```":
            return block
        block.append((number, line))
    raise ListError("the ```text block after the marker line is not closed")


def parse_equivalent(text: str, source: str = "<list>") -> dict[str, str]:
    equivalent: dict[str, str] = {}
    for number, line in listed_lines(text):
        name, _, reason = line.partition("#")
        name = name.strip()
        if not name:
            continue
        if " " in name or "__mutmut_" not in name:
            raise ListError(f"{source}:{number}: {name!r} is not a mutant's name")
        if not reason.strip():
            raise ListError(f"{source}:{number}: {name} has no reason")
        if name in equivalent:
            raise ListError(f"{source}:{number}: {name} is listed twice")
        equivalent[name] = reason.strip()
    return equivalent


def read_equivalent(path: Path) -> dict[str, str]:
    try:
        return parse_equivalent(path.read_text(encoding="utf-8"), str(path))
    except ListError as exc:
        sys.exit(f"{path}: {exc}")


def read_results(mutants: Path) -> dict[str, int | None]:
    results: dict[str, int | None] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        results.update(json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"])
    return results


def status(code: int | None) -> str:
    if code is None:
        return "not checked"
    return KILLED.get(code) or SURVIVED.get(code) or f"suspicious (exit {code})"


def module_of(name: str) -> str:
    """``trio_gateway.core.sse.xǁSSEDecoderǁfeed__mutmut_7`` -> ``trio_gateway.core.sse``."""
    return name.rsplit(".", 1)[0]


def print_modules(results: dict[str, int | None], equivalent: dict[str, str]) -> None:
    """One line per module: mutants, killed, equivalent, survived, no tests, not checked."""
    rows: dict[str, Counter[str]] = {}
    for name, code in results.items():
        row = rows.setdefault(module_of(name), Counter())
        row["mutants"] += 1
        if code in KILLED:
            row["killed"] += 1
        elif code is None:
            row["not checked"] += 1
        elif name in equivalent:
            row["equivalent"] += 1
        elif code in (5, 33):
            row["no tests"] += 1
        else:
            row["survived"] += 1
    columns = ("mutants", "killed", "equivalent", "survived", "no tests", "not checked")
    print(f"{'module':<40}" + "".join(f"{c:>12}" for c in columns))
    for module in sorted(rows):
        print(f"{module:<40}" + "".join(f"{rows[module][c]:>12}" for c in columns))


def merged_lock(
    lock: dict[str, str], listed: dict[str, str], decided: set[str], survived: dict[str, str]
) -> dict[str, str]:
    """The lock after a run: the fingerprints of the listed mutants this run saw survive, and
    the old entries of listed mutants it did not check (another part's, or left unchecked:
    ``--only``, or a run of some modules only); names no longer listed are dropped."""
    kept = {n: fp for n, fp in lock.items() if n in listed and n not in decided}
    return kept | survived


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=ROOT / "mutants")
    parser.add_argument("--equivalent", type=Path, default=EQUIVALENT)
    parser.add_argument("--min-score", type=float, default=0.0)
    parser.add_argument(
        "--only", nargs="+", default=None, metavar="PREFIX", help="mutant name prefixes"
    )
    parser.add_argument(
        "--lock",
        action="store_true",
        help="record the listed equivalents this run saw survive, so later runs skip them "
        "while their source is unchanged (tools/mutation/equivalent.lock)",
    )
    args = parser.parse_args()

    results = read_results(args.mutants)
    equivalent = listed_all = read_equivalent(args.equivalent)
    if args.only:
        prefixes = tuple(args.only)
        results = {name: code for name, code in results.items() if name.startswith(prefixes)}
        equivalent = {name: why for name, why in equivalent.items() if name.startswith(prefixes)}
    if not results:
        print(f"no results under {args.mutants}: run `make mutation` first", file=sys.stderr)
        return 1

    stale = sorted(name for name in equivalent if name not in results)
    killed_but_listed = sorted(
        name for name in equivalent if name in results and results[name] in KILLED
    )
    by_status = Counter(status(code) for code in results.values())
    killed = sum(1 for code in results.values() if code in KILLED)
    # A listed mutant counts as equivalent once checked (a run cut short leaves some unchecked).
    listed = sum(
        1
        for name in equivalent
        if name in results and results[name] is not None and results[name] not in KILLED
    )
    total = len(results)
    survivors = sorted(
        name for name, code in results.items() if code not in KILLED and name not in equivalent
    )

    for name in survivors:
        print(f"  {status(results[name]):<12} {name}")
    print_modules(results, equivalent)
    score = 100.0 * killed / (total - listed) if total > listed else 100.0
    detail = ", ".join(f"{count} {name}" for name, count in sorted(by_status.items()))
    print(f"mutants: {total} ({detail})")
    print(
        f"killed {killed}, not killed {total - killed - listed}, equivalent {listed}: "
        f"score {killed}/{total - listed} = {score:.1f} %"
    )
    unchecked = sum(1 for code in results.values() if code is None)
    if unchecked:
        checked = total - unchecked - listed
        print(
            f"{unchecked} not checked (a run cut short); of the checked ones: "
            f"{killed}/{checked} = {100.0 * killed / max(checked, 1):.1f} %"
        )
    lock = read_lock()
    src = args.mutants / "src"
    current = {name: fingerprint_of(name, src) for name in equivalent if name in results}
    skipped = [n for n in current if results[n] == 5 and lock.get(n) == current[n]]
    rerun = sorted(n for n in current if lock.get(n) != current[n])
    if skipped:
        print(f"{len(skipped)} listed equivalents not run again: their source is unchanged")
    if rerun:
        print(f"{len(rerun)} listed equivalents ran (new, or changed since `report.py --lock`)")
    if args.lock:
        survived = {
            n: fp
            for n, fp in current.items()
            if fp is not None and (results[n] == 0 or n in skipped)
        }
        decided = {n for n in current if results[n] is not None}
        merged = merged_lock(lock, listed_all, decided, survived)
        write_lock(merged)
        print(f"equivalent.lock: {len(merged)} fingerprints")
    ok = score >= args.min_score
    for name in stale:
        print(f"the equivalent list names {name}, which the run did not produce", file=sys.stderr)
        ok = False
    for name in killed_but_listed:
        print(f"the equivalent list names {name}, which a test kills: drop it", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
