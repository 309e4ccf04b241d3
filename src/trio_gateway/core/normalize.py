"""The form filters match in: NFKC, default-ignorable code points removed, with each normalized
character's place in the original text. Pure; ``core/field_filter.py`` and ``core/filters.py``
match on it.

**Why.** ``leak`` in full-width letters (U+FF4C ...), ``le\u200bak`` (a zero-width space
inside), ``\ufb01le`` (a ligature) and ``café`` written with a combining accent read the same to a
model as ``leak``, ``file`` and ``café``; matched as written, each passes a filter. NFKC folds
the compatibility forms and composes the accents; the Default_Ignorable_Code_Point characters
(zero-width spaces and joiners, soft hyphens, bidi and variation selectors, tag characters:
invisible by definition) are removed first, so one between a letter and its accent does not
keep them apart.

**The map.** NFKC changes lengths (the ligature U+FB01 → ``fi``, ``e`` + U+0301 → ``é``), so
each normalized character carries the span of original text it came from: the *segment* it is
part of. The text is cut into segments at every normalization boundary (Unicode's: a place no
later character can normalize across); each segment is normalized alone, which is the same as
normalizing the whole, and each of its normalized characters maps to the whole segment. A match
on the normalized text covers, in the original, every segment it touches (so a match on the
``i`` of the ``fi`` a ligature became masks the ligature) and the ignorable characters between
them.

**Streaming.** The last segment of what has arrived may still grow (``e`` then, in the next
piece, U+0301), so it waits; a boundary is known from one side (a character nothing can join
after, like a space or a digit, ends its segment at once). So a stream's normalized text, and
its map, are the same whatever the cuts between its pieces (property-tested in
``tests/unit/test_normalize.py``).

**Bounds.** A segment is cut after :data:`MAX_SEGMENT_CHARS` characters (the Unicode
Stream-Safe Text Format's idea: 30 combining marks is more than any real text has), and in a
run of ignorable characters only the first :data:`MAX_IGNORED_RUN` are removed, the rest kept as
ordinary characters: what one normalized character stands for, and so what a stream holds back
for it, is bounded.
"""

from __future__ import annotations

import bisect
import functools
import unicodedata
from typing import Final

import regex

MAX_SEGMENT_CHARS: Final = 32
MAX_IGNORED_RUN: Final = 32
# Canonical decompositions end with the CJK compatibility ideographs at U+2FA1D.
_LAST_DECOMPOSABLE: Final = 0x2FA1D
_HANGUL_L: Final = range(0x1100, 0x1113)
_HANGUL_V: Final = range(0x1161, 0x1176)
_HANGUL_T: Final = range(0x11A8, 0x11C3)

_DI = regex.compile(r"\p{Default_Ignorable_Code_Point}")
# Runs of ignorable characters: the first MAX_IGNORED_RUN go, the rest stay (group 2).
_DI_RUNS = regex.compile(
    rf"(\p{{Default_Ignorable_Code_Point}}{{1,{MAX_IGNORED_RUN}}})"
    r"(\p{Default_Ignorable_Code_Point}*)"
)
# Characters that may have no boundary before them (a superset: a non-starter, or a starter a
# normalization may join to the one before): a run this long may meet a segment's cut.
_LONG_JOIN_RUN = regex.compile(rf"[\p{{^ccc=0}}\p{{^NFKC_QC=Yes}}]{{{MAX_SEGMENT_CHARS - 1}}}")

# The properties of a character, as bits.
IGNORABLE: Final = 1
BOUNDARY_BEFORE: Final = 2  # nothing before it normalizes together with it
BOUNDARY_AFTER: Final = 4  # nothing after it normalizes together with it
STABLE: Final = 8  # NFKC leaves it as it is
# A character that is a segment of its own and its own normal form, whatever came before it.
SIMPLE: Final = BOUNDARY_BEFORE | STABLE
# Chunks of a stream (a model's tokens, which repeat) known to be all SIMPLE characters or not.
_SIMPLE_TEXTS_MAX: Final = 16384


@functools.cache
def _composition_pairs() -> tuple[frozenset[str], frozenset[str]]:
    """Characters that begin (``firsts``) or end (``seconds``) a canonical composition pair:
    the only ones a neighbour can compose with. Read once from Python's Unicode database."""
    firsts: set[str] = set()
    seconds: set[str] = set()
    for code in range(_LAST_DECOMPOSABLE + 1):
        decomposition = unicodedata.decomposition(chr(code))
        if decomposition and decomposition[0] != "<":
            parts = decomposition.split()
            if len(parts) == 2:
                firsts.add(chr(int(parts[0], 16)))
                seconds.add(chr(int(parts[1], 16)))
    # Hangul composes by arithmetic: L + V, then LV + T.
    firsts.update(map(chr, _HANGUL_L), map(chr, _HANGUL_V))
    seconds.update(map(chr, _HANGUL_V), map(chr, _HANGUL_T))
    return frozenset(firsts), frozenset(seconds)


def _properties(char: str) -> int:
    firsts, seconds = _composition_pairs()
    decomposed = unicodedata.normalize("NFKD", char)
    bits = IGNORABLE if _DI.match(char) else 0
    if not unicodedata.combining(decomposed[0]) and decomposed[0] not in seconds:
        bits |= BOUNDARY_BEFORE
    if not unicodedata.combining(decomposed[-1]) and decomposed[-1] not in firsts:
        bits |= BOUNDARY_AFTER
    if unicodedata.is_normalized("NFKC", char):
        bits |= STABLE
    return bits


class _PropertyTable(dict[str, int]):
    """A character's bits, computed on first sight (bounded cache)."""

    def __missing__(self, char: str) -> int:
        bits = _properties(char)
        if len(self) < 65536:
            self[char] = bits
        return bits


PROPERTIES = _PropertyTable()
_SIMPLE_TEXTS: dict[str, bool] = {}


def _all_simple(text: str) -> bool:
    simple = _SIMPLE_TEXTS.get(text)
    if simple is None:
        table = PROPERTIES
        simple = all(table[c] & (SIMPLE | IGNORABLE) == SIMPLE for c in text)
        if len(_SIMPLE_TEXTS) < _SIMPLE_TEXTS_MAX:
            _SIMPLE_TEXTS[text] = simple
    return simple


# An ASCII character is a segment of its own; one that can begin a composition pair (``e`` of
# ``e`` + U+0301, ``<`` of ``≮``) waits for the next one. Every letter but Q, as
# tests/unit/test_normalize.py checks against the Unicode database.
ASCII_FIRSTS: Final = frozenset("<=>ABCDEFGHIJKLMNOPRSTUVWXYZabcdefghijklmnoprstuvwxyz")


def warm() -> None:
    """Reads the composition pairs now (a tenth of a second, once), not in a stream's step."""
    _composition_pairs()


def normalize(text: str) -> str:
    """The whole of a text in the form filters match (the same as a stream of it would give)."""
    if text.isascii():
        return text
    stripped = _DI_RUNS.sub(r"\2", text)
    if not _LONG_JOIN_RUN.search(stripped):
        # No segment reaches its cut: normalizing segment by segment is normalizing the whole.
        return unicodedata.normalize("NFKC", stripped)
    normalizer = Normalizer()
    return normalizer.feed(text) + normalizer.flush()


class SpanMap:
    """Each normalized character's original span, as runs: a run where normalized and original
    text go character for character (``[j + shift, j + shift + 1)``), or a segment whose
    normalized characters all stand for one original span. A stream of text that normalization
    leaves alone is one run, whatever its length."""

    __slots__ = ("_ends", "_norm", "_orig", "_shift", "produced")

    def __init__(self) -> None:
        self._norm: list[int] = []  # where each run begins, in the normalized text
        self._orig: list[int] = []  # where it begins in the original
        self._ends: list[int] = []  # -1: one for one; else where the segment ends
        self._shift: int | None = None  # the last run's original - normalized, if one for one
        self.produced = 0  # normalized characters mapped

    def same(self, start: int, count: int) -> None:
        """``count`` normalized characters that are the original's from ``start`` on."""
        n = self.produced
        self.produced = n + count
        if self._shift == start - n:
            return  # goes on the last run
        self._norm.append(n)
        self._orig.append(start)
        self._ends.append(-1)
        self._shift = start - n

    def segment(self, start: int, end: int, count: int) -> None:
        """``count`` normalized characters that all stand for ``[start, end)``."""
        if count == 1 and end == start + 1:
            self.same(start, 1)
            return
        self._norm.append(self.produced)
        self._orig.append(start)
        self._ends.append(end)
        self._shift = None
        self.produced += count

    def start(self, j: int) -> int:
        """Where the original text of normalized character ``j`` begins."""
        if self._shift is not None and j >= self._norm[-1]:
            return j + self._shift  # the last run, one for one: most asked
        i = bisect.bisect_right(self._norm, j) - 1
        return self._orig[i] + (j - self._norm[i]) if self._ends[i] < 0 else self._orig[i]

    def end(self, j: int) -> int:
        """Where the original text of normalized character ``j`` ends."""
        i = bisect.bisect_right(self._norm, j) - 1
        end = self._ends[i]
        return self._orig[i] + (j - self._norm[i]) + 1 if end < 0 else end

    def forget(self, j: int) -> None:
        """Normalized characters before ``j`` will not be asked for again."""
        if len(self._norm) < 2:
            return
        i = bisect.bisect_right(self._norm, j) - 1
        if i > 0:
            del self._norm[:i], self._orig[:i], self._ends[:i]


class Normalizer:
    """One stream's text, normalized as it arrives. :meth:`feed` returns the normalized text
    decided so far; :attr:`map` has, for each of its characters, the original span it came
    from (offsets in the whole stream)."""

    __slots__ = ("_open", "_open_at", "_run", "fed", "map", "stable")

    def __init__(self) -> None:
        self._open = ""  # the last segment, which may still grow (ignorables removed)
        self._open_at: list[int] = []  # the original offset of each of its characters
        self._run = 0  # ignorable characters removed in a row
        self.fed = 0  # original characters fed
        self.stable = 0  # the normalized text stands for the original text before this
        self.map = SpanMap()

    def feed(self, text: str) -> str:
        base = self.fed
        self.fed = base + len(text)
        if not text:
            return ""
        if text.isascii():
            return self._simple(text, base, text[-1] not in ASCII_FIRSTS)
        if _all_simple(text):
            return self._simple(text, base, bool(PROPERTIES[text[-1]] & BOUNDARY_AFTER))
        return self._general(text, base)

    def flush(self) -> str:
        """The last segment, as if the text ended here (the end of the stream, or of a run of
        the field between two others)."""
        out: list[str] = []
        self._emit(out)
        self.stable = self.fed
        return "".join(out)

    def _simple(self, text: str, base: int, ends_here: bool) -> str:
        """Text of SIMPLE characters (any ASCII text): each a segment of its own and its own
        normal form; the last waits unless nothing can join it (``ends_here``)."""
        said = text
        start = base
        if self._open:  # the first character is a boundary before it: it is whole
            at = self._open_at[0]
            if at + 1 == base and len(self._open) == 1 and PROPERTIES[self._open] & STABLE:
                said = self._open + text  # one run with the text (the usual held letter)
                start = at
            else:
                out: list[str] = []
                self._emit(out)
                said = out[0] + text
        end = base + len(text)
        if ends_here:
            self._open = ""
            self._open_at = []
        else:
            said = said[:-1]
            end -= 1
            self._open = text[-1]
            self._open_at = [end]
        self._run = 0
        self.map.same(start, end - start)
        self.stable = end if self._open else self.fed
        return said

    def _general(self, text: str, base: int) -> str:
        out: list[str] = []
        table = PROPERTIES
        for i, char in enumerate(text):
            bits = table[char]
            if bits & IGNORABLE and self._run < MAX_IGNORED_RUN:
                self._run += 1
                continue
            self._run = 0
            if self._open and (bits & BOUNDARY_BEFORE or len(self._open) >= MAX_SEGMENT_CHARS):
                self._emit(out)
            self._open += char
            self._open_at.append(base + i)
            if bits & BOUNDARY_AFTER:
                self._emit(out)
        self.stable = self._open_at[0] if self._open else self.fed
        return "".join(out)

    def _emit(self, out: list[str]) -> None:
        segment = self._open
        if not segment:
            return
        start = self._open_at[0]
        if len(segment) == 1 and PROPERTIES[segment] & STABLE:
            out.append(segment)
            self.map.same(start, 1)
        else:
            normal = unicodedata.normalize("NFKC", segment)
            out.append(normal)
            self.map.segment(start, self._open_at[-1] + 1, len(normal))
        self._open = ""
        self._open_at = []
