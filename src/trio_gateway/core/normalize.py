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
    starts: list[int] = []
    return normalizer.feed(text, starts, starts) + normalizer.flush(starts, starts)


class Normalizer:
    """One stream's text, normalized as it arrives. :meth:`feed` returns the normalized text
    decided so far and appends, for each of its characters, the original span ``[start, end)``
    it came from (offsets in the whole stream)."""

    __slots__ = ("_open", "_open_at", "_run", "fed", "stable")

    def __init__(self) -> None:
        self._open = ""  # the last segment, which may still grow (ignorables removed)
        self._open_at: list[int] = []  # the original offset of each of its characters
        self._run = 0  # ignorable characters removed in a row
        self.fed = 0  # original characters fed
        self.stable = 0  # the normalized text stands for the original text before this

    def feed(self, text: str, starts: list[int], ends: list[int]) -> str:
        base = self.fed
        self.fed = base + len(text)
        if not text:
            return ""
        if text.isascii() and (not self._open or self._open.isascii()):
            return self._ascii(text, base, starts, ends)
        return self._general(text, base, starts, ends)

    def flush(self, starts: list[int], ends: list[int]) -> str:
        """The last segment, as if the text ended here (the end of the stream, or of a run of
        the field between two others)."""
        out: list[str] = []
        self._emit(out, starts, ends)
        self.stable = self.fed
        return "".join(out)

    def _ascii(self, text: str, base: int, starts: list[int], ends: list[int]) -> str:
        """Every ASCII character is a segment of its own and its own normal form."""
        said = text
        if self._open:  # one ASCII character: the next one is a boundary before it
            at = self._open_at[0]
            starts.append(at)
            ends.append(at + 1)
            said = self._open + text
        end = base + len(text)
        if text[-1] in ASCII_FIRSTS:
            said = said[:-1]
            end -= 1
            self._open, self._open_at = text[-1], [end]
        else:
            self._open, self._open_at = "", []
        self._run = 0
        starts.extend(range(base, end))
        ends.extend(range(base + 1, end + 1))
        self.stable = end if self._open else self.fed
        return said

    def _general(self, text: str, base: int, starts: list[int], ends: list[int]) -> str:
        out: list[str] = []
        table = PROPERTIES
        for i, char in enumerate(text):
            bits = table[char]
            if bits & IGNORABLE and self._run < MAX_IGNORED_RUN:
                self._run += 1
                continue
            self._run = 0
            if self._open and (bits & BOUNDARY_BEFORE or len(self._open) >= MAX_SEGMENT_CHARS):
                self._emit(out, starts, ends)
            self._open += char
            self._open_at.append(base + i)
            if bits & BOUNDARY_AFTER:
                self._emit(out, starts, ends)
        self.stable = self._open_at[0] if self._open else self.fed
        return "".join(out)

    def _emit(self, out: list[str], starts: list[int], ends: list[int]) -> None:
        segment = self._open
        if not segment:
            return
        if len(segment) == 1 and PROPERTIES[segment] & STABLE:
            normal = segment
        else:
            normal = unicodedata.normalize("NFKC", segment)
        start, end = self._open_at[0], self._open_at[-1] + 1
        out.append(normal)
        starts.extend([start] * len(normal))
        ends.extend([end] * len(normal))
        self._open, self._open_at = "", []
