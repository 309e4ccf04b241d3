"""The body reader every front shares (core/body.py): JSON as RFC 8259 has it, each refusal
placed (line and column), ``json.loads``'s values for everything else, msgspec's fast path
giving exactly those values; and the bound on content parts."""

from __future__ import annotations

import contextvars
import json
import math
from collections.abc import Callable
from typing import Any
from unittest import mock

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trio_gateway.core import body
from trio_gateway.core.body import (
    CHAT_PARTS,
    MAX_CONTENT_PARTS,
    JSONRefused,
    check_parts,
    loads,
)
from trio_gateway.core.errors import InvalidJSON, InvalidRequest
from trio_gateway.core.request import parse_chat_request, read_chat_json
from trio_gateway.core.validation import MAX_DEPTH

LONE = "(half of a UTF-16 pair, not a character)"


@pytest.mark.parametrize(
    ("raw", "refusal"),
    [
        (b'{"a": "\\ud800"}', f"a lone surrogate \\ud800 {LONE} at line 1 column 8"),
        (b'{"a": "x\\uDBFF"}', f"a lone surrogate \\udbff {LONE} at line 1 column 9"),
        # A high half followed by no low half, or a low half first: each alone.
        (b'["\\ud83d\\u0041"]', f"a lone surrogate \\ud83d {LONE} at line 1 column 3"),
        (b'["\\ud83d\\\\ude00"]', f"a lone surrogate \\ud83d {LONE} at line 1 column 3"),
        (b'["\\ude00\\ud83d"]', f"a lone surrogate \\ude00 {LONE} at line 1 column 3"),
        (
            b'["ok", "\\ud83d\\ude00\\ud83d"]',
            f"a lone surrogate \\ud83d {LONE} at line 1 column 21",
        ),
        # In a key, too; and in a text (not bytes) holding the character itself.
        (b'{"\\udc00": 1}', f"a lone surrogate \\udc00 {LONE} at line 1 column 3"),
        ('{"a": "\ud800"}', f"a lone surrogate \\ud800 {LONE} at line 1 column 8"),
        (
            b'{"t": ' + b"9" * 5000 + b"}",
            "an integer of 5000 digits (at most 4300) at line 1 column 7",
        ),
        (b"[-" + b"1" * 4301 + b"]", "an integer of 4301 digits (at most 4300) at line 1 column 2"),
        (b'{"t": 1e400}', "a number out of range (past a double's 1.8e308) at line 1 column 7"),
        (b"[-1.5E999]", "a number out of range (past a double's 1.8e308) at line 1 column 2"),
        (b'{\n  "t": NaN}', "NaN is not a JSON value at line 2 column 8"),
        (b"[1, Infinity]", "Infinity is not a JSON value at line 1 column 5"),
        (b"[-Infinity]", "-Infinity is not a JSON value at line 1 column 2"),
        (
            b"[" * 100_000 + b"]" * 100_000,
            f"nested too deeply (more than {MAX_DEPTH} levels of objects and arrays) "
            f"at line 1 column {MAX_DEPTH + 1}",
        ),
        # What json itself says, where it says it.
        (b'{"a": 1,}', "Expecting property name enclosed in double quotes at line 1 column 9"),
        (b"[1] x", "Extra data at line 1 column 5"),
        ("\ufeff{}", "Unexpected UTF-8 BOM (decode using utf-8-sig) at line 1 column 1"),
    ],
)
def test_each_refusal_says_what_and_where(raw: bytes | str, refusal: str) -> None:
    with pytest.raises(JSONRefused) as caught:
        loads(raw)
    assert str(caught.value) == refusal


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b'["\\ud83d\\ude00"]', ["\U0001f600"]),
        # An escaped backslash before "ud800": text, not an escape.
        (b'["\\\\ud800"]', ["\\ud800"]),
        (b'["\\u005cud800"]', ["\\ud800"]),
        (b'{"t": ' + b"9" * 4300 + b"}", {"t": int("9" * 4300)}),
        (b"[1.7976931348623157e308, 1e-400, -0.0]", [1.7976931348623157e308, 0.0, -0.0]),
        (b'{"a": 1, "b": 2, "a": 3}', {"a": 3, "b": 2}),
        ('{"a": "é"}'.encode("utf-16"), {"a": "é"}),
        (b'\xef\xbb\xbf{"a": 1}', {"a": 1}),
    ],
)
def test_what_json_reads_is_read_as_json_reads_it(raw: bytes, value: Any) -> None:
    assert same(loads(raw), value)
    assert same(loads(raw), json.loads(raw))


def test_bytes_that_are_not_utf8_are_placed_by_byte() -> None:
    # A surrogate encoded directly in UTF-8 (json.loads would take it, "surrogatepass").
    raw = b'{"model": "a", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'
    with pytest.raises(InvalidJSON) as caught:
        parse_chat_request(raw)
    assert caught.value.message == "request body is not UTF-8: invalid continuation byte at byte 57"
    escaped = b'{"model": "a", "messages": [{"role": "user", "content": "\\ud800"}]}'
    with pytest.raises(InvalidJSON) as caught:
        parse_chat_request(escaped)
    assert caught.value.message == (
        f"request body is not valid JSON: a lone surrogate \\ud800 {LONE} at line 1 column 58"
    )


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 is not 1.0, -0.0 not 0.0), with keys
    in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


def json_reading(raw: bytes | str) -> tuple[str, Any]:
    """What json.loads reads, held to the RFC: ("value", v) or ("refused", None)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return ("refused", None)
    return ("refused", None) if not rfc_json(value) else ("value", value)


def rfc_json(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return all(rfc_json(item) for item in value)
    if isinstance(value, dict):
        return all(rfc_json(k) and rfc_json(v) for k, v in value.items())
    return True


def outcome(read: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("value", read())
    except ValueError:  # JSONRefused, UnicodeDecodeError
        return ("refused", None)


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**400, -(10**4299), 2**64])
    | st.floats()
    | st.text(st.characters(codec="utf-8") | st.sampled_from(["\ud800", "\udfff"]), max_size=6)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=8,
)
# json.dumps writes NaN, Infinity and a lone surrogate's escape; the rest is JSON.
TEXTS = st.one_of(
    VALUES.map(json.dumps),
    VALUES.map(lambda v: json.dumps(v, ensure_ascii=False)),
    st.text(max_size=20),
    st.sampled_from(['"\\ud83d\\ude00"', '["\\\\ud800"]', "1e400", "[" * 5000, "9" * 4301]),
)
RAW = st.one_of(
    TEXTS.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.tuples(TEXTS, st.sampled_from(["utf-8-sig", "utf-16", "utf-16-le", "utf-32"])).map(
        lambda pair: pair[0].encode(pair[1], "surrogatepass")
    ),
    st.binary(max_size=20),
)


@settings(max_examples=400, deadline=None)
@given(raw=TEXTS | RAW)
@example(raw=b'"\xed\xa0\x80"')
def test_the_reader_reads_what_json_reads_and_refuses_what_the_rfc_does(raw: bytes | str) -> None:
    expected = json_reading(raw)
    got = outcome(lambda: loads(raw))
    assert got[0] == expected[0], (raw, got, expected)
    assert same(got[1], expected[1])


@settings(max_examples=300, deadline=None)
@given(raw=TEXTS | RAW)
def test_a_text_read_in_pieces_is_read_as_a_whole_one(raw: bytes | str) -> None:
    """Past PIECE_BYTES (here 8 bytes, and with no object too few to be cut, so that every
    container is cut), the same values and refusals, placed where a whole reading places
    them."""
    whole = outcome(lambda: loads(raw))
    with mock.patch.object(body, "PIECE_BYTES", 8), mock.patch.object(body, "WHOLE_OBJECTS", 0):
        cut = outcome(lambda: loads(raw))
    assert cut[0] == whole[0] and same(cut[1], whole[1])


def test_a_fault_deep_in_a_big_text_is_placed_in_the_whole_text() -> None:
    parts = [{"type": "text", "text": "x"}] * 5000
    raw = json.dumps({"messages": [{"content": parts}, {"content": "\ud800"}]}).encode()
    assert len(raw) > body.PIECE_BYTES
    column = raw.index(rb"\ud800") + 1
    with pytest.raises(JSONRefused, match=f"at line 1 column {column}$"):
        loads(raw)


@settings(max_examples=300, deadline=None)
@given(raw=TEXTS.map(str.encode) | RAW)
def test_msgspec_gives_json_s_values_for_every_text_it_takes(raw: bytes) -> None:
    """The fast path is only a shortcut: where msgspec reads a body, json reads it the same."""
    try:
        fast = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return
    assert same(fast, json.loads(raw))


def test_the_content_parts_are_bounded_naming_the_first_past_the_bound() -> None:
    half = MAX_CONTENT_PARTS // 2
    part = {"type": "text", "text": "x"}
    messages = [{"role": "user", "content": [part] * (half - 1)} for _ in range(2)]
    check_parts({"messages": messages}, CHAT_PARTS)  # 2 messages + 2 * (half - 1) parts
    messages[1]["content"] = [part] * half
    with pytest.raises(InvalidRequest) as caught:
        check_parts({"messages": messages}, CHAT_PARTS)
    assert caught.value.param == f"messages[1].content[{half - 1}]"
    assert caught.value.message == (
        f"Invalid 'messages[1].content[{half - 1}]': too many content parts. Expected at most "
        f"{MAX_CONTENT_PARTS} messages and content parts in the request body "
        "(MAX_CONTENT_PARTS), but got more."
    )


def test_many_messages_count_as_parts_and_shapes_not_arrays_count_nothing() -> None:
    many = [{"role": "user", "content": "x"}] * (MAX_CONTENT_PARTS + 1)
    with pytest.raises(InvalidRequest) as caught:
        check_parts({"messages": many}, CHAT_PARTS)
    assert caught.value.param == f"messages[{MAX_CONTENT_PARTS}]"
    shapes: list[object] = [{}, {"messages": {}}, {"messages": ["x", 3, {"content": {}}]}, [1], "x"]
    for shape in shapes:
        check_parts(shape, CHAT_PARTS)


PART = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=3)})
SHAPED = st.fixed_dictionaries(
    {
        "system": st.lists(PART, max_size=3) | st.text(max_size=3),
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.just("user"),
                    "content": st.lists(
                        PART | st.fixed_dictionaries({"content": st.lists(PART, max_size=3)}),
                        max_size=4,
                    )
                    | st.text(max_size=3),
                }
            ),
            max_size=4,
        ),
        "*": st.lists(PART, max_size=2),
    }
)
MESSAGES_SHAPE = (
    ("system",),
    ("messages",),
    ("messages", "*", "content"),
    ("messages", "*", "content", "*", "content"),
)


def refusal_of(read: Callable[[], object]) -> tuple[str, str | None] | None:
    try:
        read()
    except InvalidRequest as exc:
        return exc.message, exc.param
    return None


@settings(max_examples=200, deadline=None)
@given(
    value=SHAPED | VALUES,
    bound=st.integers(min_value=0, max_value=12),
    piece=st.sampled_from([8, 40, 100, 400, 10**6]),
)
@example(
    # Messages small enough to be read together (the parts under them counted after), in a
    # body too big to be read whole.
    value={"messages": [{"content": [{"type": "text", "text": ""}] * 2}] * 4},
    bound=9,
    piece=80,
)
def test_parts_counted_while_reading_are_counted_as_in_the_value(
    value: Any, bound: int, piece: int
) -> None:
    """In pieces (the arrays counted before their items are read) or whole, a body is refused
    at the same part as :func:`check_parts` of its value refuses it, or at none."""
    raw = json.dumps(value).encode()
    if json_reading(raw)[0] != "value":
        return
    with mock.patch.object(body, "MAX_CONTENT_PARTS", bound):
        expected = refusal_of(lambda: check_parts(json.loads(raw), MESSAGES_SHAPE))
        with (
            mock.patch.object(body, "PIECE_BYTES", piece),
            mock.patch.object(body, "WHOLE_OBJECTS", 0),
        ):
            assert refusal_of(lambda: loads(raw, MESSAGES_SHAPE)) == expected


def test_a_chat_body_of_too_many_parts_is_refused_as_read() -> None:
    parts = [{"type": "text", "text": "x"}] * (MAX_CONTENT_PARTS + 1)
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": parts}]}).encode()
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(raw)
    assert caught.value.param == f"messages[0].content[{MAX_CONTENT_PARTS - 1}]"
    # The reader bounds the arrays a front names; the chat front's are bounded by validation.
    assert read_chat_json(raw)["model"] == "m"
    with pytest.raises(InvalidRequest):
        read_chat_json(raw, CHAT_PARTS)


def test_the_reader_hands_over_between_the_pieces_of_a_big_text_only() -> None:
    calls: list[None] = []
    parts = [{"type": "text", "text": "x"}] * 5000
    big = json.dumps({"messages": [{"content": parts}]}).encode()
    assert len(big) > body.PIECE_BYTES

    def read(raw: bytes) -> int:
        calls.clear()
        body.BETWEEN_PIECES.set(lambda: calls.append(None))
        loads(raw)
        return len(calls)

    # One hand-over per level read holding the GIL: the body, messages, the message, content.
    with mock.patch.object(body, "WHOLE_OBJECTS", 1000):
        assert contextvars.copy_context().run(read, big) == 4
    assert contextvars.copy_context().run(read, b'{"messages": []}') == 0
    # Big, but of few objects (128,000 token ids): read whole, in a few milliseconds.
    tokens = json.dumps({"prompt": list(range(128_000))}).encode()
    assert len(tokens) > body.PIECE_BYTES
    assert contextvars.copy_context().run(read, tokens) == 0
