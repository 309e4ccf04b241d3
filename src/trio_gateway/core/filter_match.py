"""What an output or input filter looks for, compiled: many literals in one pass, and regexes whose
longest match is bounded, run on RE2. Pure; the streaming side is ``core/field_filter.py``.

Both match the text in its normalized form (``core/normalize.py``: NFKC, default-ignorable code
points removed), and the patterns are normalized the same way when compiled.

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
(full folding would). RE2's case-insensitive mode does the same kind of simple folding, so
literals and regexes agree.

**Regexes** run on RE2 (Google's engine, through its own binding ``google-re2``): its time is
linear in the text whatever the pattern (no backtracking), so no answer a client can steer a
model into writing makes a filter slow. What RE2 has not (lookarounds, backreferences, atomic
groups, possessive repeats, conditionals) is refused by name. A regex must have a bounded longest
match, read with Python's own parser (``getwidth()``; RE2's Unicode classes ``\\p{..}`` and
code points ``\\x{..}`` count one character): ``\\d+`` is refused, ``\\d{1,12}`` is not; and
may not match the empty string. Its *reach* is that longest match plus what its anchors read past
it (``\\b`` reads one character beyond, ``$`` two): a start position is decided once that much
text follows it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any, Literal

import attrs
import re2

from trio_gateway.core.normalize import normalize, warm

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
    pattern: Any  # an RE2 regexp (``re2._Regexp``: the binding ships no types)
    rule: int
    reach: int  # longest match + what anchors read after it
    behind: int  # what anchors read before a match's start


class RegexRefused(ValueError):
    """A filter regex the gateway will not run (unbounded, empty, invalid, or not RE2's)."""


# What Python's parser reads that RE2 has not, by the parser's opcode: refused by name.
_NOT_RE2 = {
    sre_constants.GROUPREF: "a backreference",
    sre_constants.GROUPREF_EXISTS: "a conditional group",
    sre_constants.ATOMIC_GROUP: "an atomic group",
    sre_constants.POSSESSIVE_REPEAT: "a possessive repeat",
}
# RE2's syntax that Python's parser cannot read, rewritten to an equivalent width for the
# parser's eyes only (RE2 runs the source as written): a Unicode class \pL, \p{Greek},
# \PN, \P{..} and a code point \x{263a} are one character; RE2's \z is Python's \Z.
_RE2_ONLY = re.compile(r"\\(p\{[^}]*\}|P\{[^}]*\}|[pP][A-Za-z]|x\{[0-9A-Fa-f]+\}|z|.)", re.S)


def _for_python(source: str) -> str:
    def one(m: re.Match[str]) -> str:
        escape = m.group(1)
        if escape == "z":
            return r"\Z"
        if len(escape) > 1 or escape in "pP":
            return "x"
        return m.group(0)

    return _RE2_ONLY.sub(one, source)


def _refusal(source: str) -> str | None:
    """What RE2 reads otherwise than Python's parser, caught before it misleads the bound."""
    if "{," in source:
        return "RE2 reads {,n} as the characters '{,n}': write {0,n}"
    if re.search(r"(?<!\\)(?:\\\\)*\\Z", source):
        return "RE2 has no \\Z: write \\z (the end of the text)"
    return None


def _re2(source: str, *, case_sensitive: bool) -> Any:
    options = re2.Options()
    options.case_sensitive = case_sensitive
    options.log_errors = False  # RE2 would write each refusal to stderr
    try:
        return re2.compile(source, options)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        if isinstance(why, bytes):
            why = why.decode("utf-8", "replace")
        raise RegexRefused(f"RE2, the engine filters run on, cannot run it: {why}") from None


def regex_reach(source: str, *, case_sensitive: bool) -> tuple[int, int]:
    """``(reach, behind)`` of a filter regex, or :class:`RegexRefused` saying why not."""
    if (problem := _refusal(source)) is not None:
        raise RegexRefused(problem)
    flags = 0 if case_sensitive else re.IGNORECASE
    try:
        with warnings.catch_warnings():
            # Python reads RE2's [[:alpha:]] as a nested set, warns, and over-counts by one.
            warnings.simplefilter("ignore", FutureWarning)
            parsed = sre_parse.parse(_for_python(source), flags)
    except re.error as exc:
        raise RegexRefused(
            f"not a valid regex as Python's parser reads it ({exc}); the gateway reads its "
            "longest match with that parser, so write it in the syntax RE2 and Python share"
        ) from None
    after, behind = _anchors(parsed)
    _re2(source, case_sensitive=case_sensitive)
    lo, hi = parsed.getwidth()
    if hi >= sre_parse.MAXWIDTH:
        raise RegexRefused(
            "its longest match is unbounded (a *, + or {n,} repeat): bound it, e.g. {1,64}"
        )
    if lo == 0:
        raise RegexRefused("it can match the empty string")
    if (normal := normalize(source)) != source:
        raise RegexRefused(
            "filters match the NFKC-normalized text, without default-ignorable characters; "
            f"write it as {normal!r}"
        )
    reach = hi + after
    if reach > MAX_REGEX_REACH:
        raise RegexRefused(
            f"its longest match, {hi} characters (with its anchors {reach}), is over "
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


def _anchors(parsed: Any) -> tuple[int, int]:
    """Conservative: the sum of every anchor's reach after (before) the match, wherever it
    sits in the pattern; :class:`RegexRefused` naming what RE2 has not (lookarounds,
    backreferences, atomic groups, possessive repeats, conditionals)."""
    after = behind = 0
    for op, av in parsed.data if hasattr(parsed, "data") else parsed:
        subs: Iterable[Any] = ()
        if op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            look = "a lookahead" if av[0] > 0 else "a lookbehind"
            raise RegexRefused(
                f"it has {look}, which RE2, the engine filters run on, has not (it keeps "
                "matching linear in the text): match the context itself, or drop it"
            )
        if op in _NOT_RE2:
            raise RegexRefused(
                f"it has {_NOT_RE2[op]}, which RE2, the engine filters run on, has not (it "
                "keeps matching linear in the text)"
            )
        if op is sre_constants.AT:
            after += _AT_AFTER.get(av, 0)
            behind += 1
        elif op is sre_constants.BRANCH:
            subs = av[1]
        elif op is sre_constants.SUBPATTERN:
            subs = (av[-1],)
        elif op in _REPEATS:
            subs = (av[2],)
        for sub in subs:
            a, b = _anchors(sub)
            after += a
            behind += b
    return after, behind


class Matcher:
    """Everything one field of one alias looks for: its filters' literals (two automata) and
    regexes. Immutable once built; one per alias and field, shared by every stream (and by
    threads: RE2 is safe to share)."""

    def __init__(self, specs: Sequence[FilterSpec]) -> None:
        warm()
        self.rules = tuple(Rule(i, s.name, s.action, s.mask) for i, s in enumerate(specs))
        folded: list[str] = []
        folded_rule: list[int] = []
        exact: list[str] = []
        exact_rule: list[int] = []
        regexes: list[CompiledRegex] = []
        longest = 0
        for i, spec in enumerate(specs):
            for pattern in dict.fromkeys(map(normalize, spec.patterns)):
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
                compiled = _re2(source, case_sensitive=spec.case_sensitive)
                regexes.append(CompiledRegex(compiled, i, reach, behind))
                longest = max(longest, reach)
        self.folded = Automaton(folded) if folded else None
        self.folded_rule = tuple(folded_rule)
        self.exact = Automaton(exact) if exact else None
        self.exact_rule = tuple(exact_rule)
        self.regexes = tuple(regexes)
        # What a stream may hold back, in normalized characters: never more than this minus one
        # (and the segment still open, core/normalize.py).
        self.window = longest
        self.context = max((r.behind for r in regexes), default=0)

    @property
    def empty(self) -> bool:
        return self.folded is None and self.exact is None and not self.regexes


def pattern_problem(pattern: str) -> str | None:
    if not pattern:
        return "an empty pattern matches everywhere"
    normal = normalize(pattern)
    if not normal:
        return "it is only default-ignorable characters, which the matched text never holds"
    if len(normal) > MAX_PATTERN_CHARS:
        return f"longer than {MAX_PATTERN_CHARS} characters (normalized: {len(normal)})"
    return None
