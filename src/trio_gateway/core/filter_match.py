"""What an output or input filter looks for, compiled: many literals in one pass, and regexes whose
longest match is bounded. Pure; the streaming side is ``core/filters.py``.

**Literals** go into an Aho-Corasick automaton (one for the case-insensitive ones, matched against
folded text; one for the case-sensitive ones): every occurrence of every pattern, overlapping ones
included, is found in one pass over the text, whatever the number of patterns. Each state knows
``hold``: the length of the longest suffix of the text so far that is a prefix of some pattern
*and can still grow into a longer match*; text before that suffix can no longer begin a match.

**Case-insensitive** means per code point, length-preserving folding (:func:`fold`): a character
whose full Unicode case folding is one character folds to it (``K`` → ``k``, the Kelvin sign →
``k``, the long s → ``s``, final and capital sigma → sigma); one whose full folding grows
(``ß`` → ``ss``, ``ŉ``, ligatures) folds to its lowercase if that is one character, else stays
as it is. So the folded text has exactly the length of the text, and a match's span in one is
its span in the other: masking never shifts. The price: ``STRASSE`` does not match ``straße``
(full folding would). Python's ``re.IGNORECASE`` does the same kind of simple folding,
so literals and regexes agree.

**Regexes** must have a bounded longest match (``re``'s own parser, ``getwidth()``): ``\\d+`` is
refused, ``\\d{1,12}`` is not; and may not match the empty string. Their *reach* is that longest
match plus what their lookarounds and anchors read past it (``\\b`` reads one character beyond,
``$`` two, a lookahead its own width): a start position is decided once that much text follows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any, Literal

import attrs

Action = Literal["mask", "block"]
Field = Literal["content", "reasoning", "tool_arguments"]
FIELDS: tuple[Field, ...] = ("content", "reasoning", "tool_arguments")
DEFAULT_MASK = "***"
# The longest match (plus lookaround reach) a regex may have: what a stream may hold back for it.
MAX_REGEX_REACH = 256
# The longest literal pattern: the same bound, for the same reason.
MAX_PATTERN_CHARS = 256


@attrs.frozen(kw_only=True)
class FilterSpec:
    """One ``[filters.NAME]`` table, as the core sees it."""

    name: str
    patterns: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    action: Action = "mask"
    mask: str = DEFAULT_MASK
    case_sensitive: bool = False
    applies_to: tuple[Field, ...] = FIELDS


@attrs.frozen
class Rule:
    """What a match of one filter does: ``filters`` index ``index`` (its place in the alias's
    list, which breaks ties between matches at the same place)."""

    index: int
    name: str
    action: Action
    mask: str


class _FoldTable(dict[int, str]):
    """``str.translate`` table that folds a code point on first sight (bounded cache)."""

    def __missing__(self, code: int) -> str:
        folded = _fold_char(chr(code))
        if len(self) < 65536:
            self[code] = folded
        return folded


def _fold_char(char: str) -> str:
    folded = char.casefold()
    if len(folded) == 1:
        return folded
    lower = char.lower()
    return lower if len(lower) == 1 else char


_FOLD = _FoldTable()


def fold(text: str) -> str:
    """Length-preserving case folding (see the module's docstring)."""
    if text.isascii():
        return text.lower()
    return text.translate(_FOLD)


class Automaton:
    """Aho-Corasick over ``patterns`` (non-empty strings); pattern ``i`` reports ``i``."""

    __slots__ = ("fail", "goto", "hold", "lengths", "out")

    def __init__(self, patterns: Sequence[str]) -> None:
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        ends: list[list[int]] = [[]]
        for pid, pattern in enumerate(patterns):
            state = 0
            for char in pattern:
                nxt = goto[state].get(char)
                if nxt is None:
                    nxt = len(goto)
                    goto[state][char] = nxt
                    goto.append({})
                    depth.append(depth[state] + 1)
                    ends.append([])
                state = nxt
            ends[state].append(pid)
        fail = [0] * len(goto)
        out: list[tuple[int, ...]] = [()] * len(goto)
        hold = [0] * len(goto)
        hold[0] = 0
        queue = list(goto[0].values())
        for child in queue:
            out[child] = tuple(ends[child])
            hold[child] = depth[child] if goto[child] else 0
        i = 0
        while i < len(queue):  # breadth first: a state's failure is done before the state
            state = queue[i]
            i += 1
            for char, child in goto[state].items():
                queue.append(child)
                f = fail[state]
                while char not in goto[f] and f:
                    f = fail[f]
                f = goto[f].get(char, 0)
                fail[child] = f
                out[child] = tuple(ends[child]) + out[f]
                hold[child] = depth[child] if goto[child] else hold[f]
        self.goto = goto
        self.fail = fail
        self.out = out
        self.hold = hold
        self.lengths = tuple(len(p) for p in patterns)

    def scan(self, state: int, text: str, offset: int, found: list[tuple[int, int, int]]) -> int:
        """Runs ``text`` (whose first character is at ``offset`` in the whole) from ``state``;
        appends ``(start, end, pattern)`` of every occurrence ending in it; returns the state."""
        goto, fail, out, lengths = self.goto, self.fail, self.out, self.lengths
        for i, char in enumerate(text):
            while True:
                nxt = goto[state].get(char)
                if nxt is not None:
                    state = nxt
                    break
                if not state:
                    break
                state = fail[state]
            if state and out[state]:
                end = offset + i + 1
                for pid in out[state]:
                    found.append((end - lengths[pid], end, pid))
        return state


@attrs.frozen
class CompiledRegex:
    pattern: re.Pattern[str]
    rule: int
    reach: int  # longest match + what lookarounds read after it
    behind: int  # what lookbehinds and anchors read before a match's start


class RegexRefused(ValueError):
    """A filter regex the gateway will not run (unbounded, empty, invalid)."""


def regex_reach(source: str, *, case_sensitive: bool) -> tuple[int, int]:
    """``(reach, behind)`` of a filter regex, or :class:`RegexRefused` saying why not."""
    flags = 0 if case_sensitive else re.IGNORECASE
    try:
        re.compile(source, flags)
        parsed = sre_parse.parse(source, flags)
    except re.error as exc:
        raise RegexRefused(f"not a valid regex: {exc}") from None
    lo, hi = parsed.getwidth()
    if hi >= sre_parse.MAXWIDTH:
        raise RegexRefused(
            "its longest match is unbounded (a *, + or {n,} repeat): bound it, e.g. {1,64}"
        )
    if lo == 0:
        raise RegexRefused("it can match the empty string")
    after, behind = _lookaround(parsed)
    reach = hi + after
    if reach > MAX_REGEX_REACH:
        raise RegexRefused(
            f"its longest match, {hi} characters (with lookarounds {reach}), is over "
            f"{MAX_REGEX_REACH}"
        )
    return reach, behind + 1


_AT_AFTER = {
    sre_constants.AT_BOUNDARY: 1,
    sre_constants.AT_NON_BOUNDARY: 1,
    sre_constants.AT_END: 2,  # before a last newline, or at the end
    sre_constants.AT_END_LINE: 1,
    sre_constants.AT_END_STRING: 1,
}


_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT)


def _lookaround(parsed: Any) -> tuple[int, int]:
    """Conservative: the sum of every lookahead's (lookbehind's) longest width and every
    anchor's reach, wherever it sits in the pattern."""
    after = behind = 0
    for op, av in parsed.data if hasattr(parsed, "data") else parsed:
        subs: Iterable[Any] = ()
        if op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            direction, sub = av
            width = sub.getwidth()[1]
            if direction > 0:
                after += width
            else:
                behind += width
            subs = (sub,)
        elif op is sre_constants.AT:
            after += _AT_AFTER.get(av, 0)
            behind += 1
        elif op is sre_constants.BRANCH:
            subs = av[1]
        elif op is sre_constants.SUBPATTERN:
            subs = (av[-1],)
        elif op in _REPEATS:
            subs = (av[2],)
        elif op is sre_constants.ATOMIC_GROUP:
            subs = (av,)
        elif op is sre_constants.GROUPREF_EXISTS:
            subs = tuple(s for s in av[1:] if s is not None)
        for sub in subs:
            a, b = _lookaround(sub)
            after += a
            behind += b
    return after, behind


class Matcher:
    """Everything one field of one alias looks for: its filters' literals (two automata) and
    regexes. Immutable once built; one per alias and field, shared by every stream."""

    def __init__(self, specs: Sequence[FilterSpec]) -> None:
        self.rules = tuple(Rule(i, s.name, s.action, s.mask) for i, s in enumerate(specs))
        folded: list[str] = []
        folded_rule: list[int] = []
        exact: list[str] = []
        exact_rule: list[int] = []
        regexes: list[CompiledRegex] = []
        longest = 0
        for i, spec in enumerate(specs):
            for pattern in dict.fromkeys(spec.patterns):
                if not pattern:
                    continue
                longest = max(longest, len(pattern))
                if spec.case_sensitive:
                    exact.append(pattern)
                    exact_rule.append(i)
                else:
                    folded.append(fold(pattern))
                    folded_rule.append(i)
            for source in spec.regex:
                reach, behind = regex_reach(source, case_sensitive=spec.case_sensitive)
                flags = 0 if spec.case_sensitive else re.IGNORECASE
                regexes.append(CompiledRegex(re.compile(source, flags), i, reach, behind))
                longest = max(longest, reach)
        self.folded = Automaton(folded) if folded else None
        self.folded_rule = tuple(folded_rule)
        self.exact = Automaton(exact) if exact else None
        self.exact_rule = tuple(exact_rule)
        self.regexes = tuple(regexes)
        # What a stream may hold back: never more than this minus one character.
        self.window = longest
        self.context = max((r.behind for r in regexes), default=0)

    @property
    def empty(self) -> bool:
        return self.folded is None and self.exact is None and not self.regexes


def pattern_problem(pattern: str) -> str | None:
    if not pattern:
        return "an empty pattern matches everywhere"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"longer than {MAX_PATTERN_CHARS} characters"
    return None
