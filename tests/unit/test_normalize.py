"""The form filters match in (core/normalize.py), and masking on it (issue 40, item 6): NFKC with
the default-ignorable code points removed, the same whatever the cuts of a stream, each
normalized character mapped to the original text it came from; and a word however spelled (full
width, a zero-width space inside, a combining accent, a ligature) is masked, its original
spelling replaced exactly, nothing around it touched."""

from __future__ import annotations

import unicodedata

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.core.field_filter import FieldFilter, mask_whole
from trio_gateway.core.filter_match import FilterSpec, Matcher
from trio_gateway.core.normalize import (
    ASCII_FIRSTS,
    BOUNDARY_AFTER,
    MAX_IGNORED_RUN,
    MAX_SEGMENT_CHARS,
    PROPERTIES,
    Normalizer,
    normalize,
)

# Letters and the characters that normalize: combining marks (one that composes, one that
# reorders), ignorables, compatibility forms, Hangul jamo that compose, a kana voicing mark
# in half width that joins the kana before it.
ALPHABET = "aeikAE fi-1é\u0301\u0323\u200b\u00ad\ufe0f\uff41\ufb01①\u1100\u1161\u11a8\uff76\uff9e"


def streamed(text: str, cuts: list[int]) -> tuple[str, list[int], list[int]]:
    """The text fed cut at ``cuts``: its normalized form and each character's original span."""
    normalizer = Normalizer()
    out = []
    previous = 0
    for cut in [*cuts, len(text)]:
        out.append(normalizer.feed(text[previous:cut]))
        previous = cut
    out.append(normalizer.flush())
    normal = "".join(out)
    spans = normalizer.map
    return (
        normal,
        [spans.start(j) for j in range(len(normal))],
        [spans.end(j) for j in range(len(normal))],
    )


@settings(max_examples=400, deadline=None)
@given(st.text(ALPHABET, max_size=30), st.data())
def test_any_cutting_gives_the_whole_texts_form_and_map(text: str, data: st.DataObject) -> None:
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 1))))
    whole = streamed(text, [])
    assert streamed(text, cuts) == whole
    normal, starts, ends = whole
    assert normal == normalize(text)
    stripped = regex.sub(r"\p{Default_Ignorable_Code_Point}", "", text)
    assert normal == unicodedata.normalize("NFKC", stripped)
    assert len(starts) == len(ends) == len(normal)
    # Spans in order, each whole segments of the original, never empty.
    assert all(0 <= a < b <= len(text) for a, b in zip(starts, ends, strict=True))
    assert starts == sorted(starts) and ends == sorted(ends)


def test_the_ascii_that_waits_is_what_the_unicode_database_says() -> None:
    computed = {chr(c) for c in range(128) if not PROPERTIES[chr(c)] & BOUNDARY_AFTER}
    assert computed == ASCII_FIRSTS


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("\uff4c\uff45\uff41\uff4b", "leak"),  # full width
        ("le\u200bak", "leak"),
        ("le\u00adak\ufeff", "leak"),
        ("\ufb01le", "file"),
        ("cafe\u0301", "café"),
        ("e\u200b\u0301", "é"),  # an ignorable does not keep a letter from its accent
        ("\uff76\uff9e", "ガ"),  # half-width kana and its voicing mark
        ("\u1100\u1161\u11a8", "각"),
        ("①②", "12"),
    ],
)
def test_spellings_that_read_the_same(text: str, normal: str) -> None:
    assert normalize(text) == normal


def test_what_one_normalized_character_stands_for_is_bounded() -> None:
    ignorables = "\u200b" * (MAX_IGNORED_RUN + 3)
    assert normalize("a" + ignorables + "b") == "a" + "\u200b" * 3 + "b"
    marks = "\u0301" * (MAX_SEGMENT_CHARS + 5)
    normalizer = Normalizer()
    normalizer.feed("a" + marks)
    assert normalizer.stable == MAX_SEGMENT_CHARS  # the first segment is cut and said


def spelled(word: str, data: st.DataObject) -> str:
    """``word`` in one of the spellings that normalize to it, letter by letter."""
    out = []
    i = 0
    while i < len(word):
        char = word[i]
        way = data.draw(st.sampled_from(["plain", "wide", "ignorable", "ligature"]))
        if way == "wide" and "!" <= char <= "~":
            char = chr(ord(char) + 0xFEE0)
        elif way == "ignorable" and i:
            char = data.draw(st.sampled_from(["\u200b", "\u200d", "\u00ad", "\u2060"])) + char
        elif way == "ligature" and word[i : i + 2] == "fi":
            char = "\ufb01"
            i += 1
        out.append(char)
        i += 1
    return "".join(out)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_masking_on_the_normal_form_replaces_exactly_the_original_span(
    data: st.DataObject,
) -> None:
    word = data.draw(st.sampled_from(["leak-this", "file", "project-falcon", "ok42"]))
    before = data.draw(st.text("xyz .,é机", max_size=8)) + " "
    after = " " + data.draw(st.text("xyz .,é机", max_size=8))
    text = before + spelled(word, data) + after
    assert normalize(text).count(word) == 1
    matcher = Matcher([FilterSpec(name="s", patterns=(word,), mask="[m]")])
    assert mask_whole(matcher, text) == (before + "[m]" + after, None)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=12))))
    field = FieldFilter(matcher)
    said = ""
    previous = 0
    for cut in [*cuts, len(text)]:
        said += field.feed(text[previous:cut])
        previous = cut
        assert (before + "[m]" + after).startswith(said)
    assert said + field.close() == before + "[m]" + after


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("say \uff4c\uff45\uff41\uff4b-\uff54\uff48\uff49\uff53 now", "say *** now"),
        ("say leak\u200b-th\u200dis now", "say *** now"),
        ("say LEAK-THIS now", "say *** now"),
        # A match on part of a ligature masks the ligature: its characters are one segment.
        ("the \ufb01", "the ***"),
        # An accent is a letter of its own: leák is another word.
        ("say lea\u0301k-this now", "say lea\u0301k-this now"),
    ],
)
def test_output_masks_every_spelling_of_a_word(text: str, masked: str) -> None:
    matcher = Matcher([FilterSpec(name="s", patterns=("leak-this", "i"))])
    if "\ufb01" not in text:
        matcher = Matcher([FilterSpec(name="s", patterns=("leak-this",))])
    assert mask_whole(matcher, text)[0] == masked
