"""SSE decoding: byte-level line splitting, arbitrary chunk boundaries, multi-byte text."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trio_gateway.core.sse import (
    DONE,
    SSEDecodeError,
    SSEDecoder,
    SSEEvent,
    encode_event,
    json_data,
)

PIECES = [
    *"abc xyz",
    *"天气巴黎你好世界",
    "🌍",
    "👩\u200d💻",
    "é",
    "\u2028",
    "\u2029",
    "\x85",
    "\n",
]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


def decode_all(data: bytes, cuts: list[int]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    last = 0
    for cut in sorted(set(cuts)):
        events += decoder.feed(data[last:cut])
        last = cut
    events += decoder.feed(data[last:])
    events += decoder.close()
    return events


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (b"data: a\n\n", [SSEEvent(b"a")]),
        (b"data:a\n\n", [SSEEvent(b"a")]),
        (b"data: a\r\n\r\n", [SSEEvent(b"a")]),
        (b"data: a\r\rdata: b\r\r", [SSEEvent(b"a"), SSEEvent(b"b")]),
        (b"data: a\ndata: b\n\n", [SSEEvent(b"a\nb")]),
        (b": keep-alive\n\ndata: x\n\n", [SSEEvent(b"x")]),
        (b"event: error\ndata: {}\n\n", [SSEEvent(b"{}", event="error")]),
        (b"retry: 100\n\n", []),
        (b"id: 7\ndata: x\n\n", [SSEEvent(b"x", id="7")]),
        (b"data: [DONE]\n\n", [SSEEvent(b"[DONE]")]),
        # A last event without its blank line is still dispatched at the end of the stream.
        (b"data: tail", [SSEEvent(b"tail")]),
    ],
)
def test_decoder_table(wire: bytes, expected: list[SSEEvent]) -> None:
    assert decode_all(wire, []) == expected
    # Byte by byte gives the same events.
    assert decode_all(wire, list(range(len(wire)))) == expected


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(TEXTS, min_size=1, max_size=6), data=st.data())
def test_any_split_points_keep_multibyte_text_whole(texts: list[str], data: st.DataObject) -> None:
    wire = b"".join(
        encode_event(json.dumps({"content": t}, ensure_ascii=False).encode()) for t in texts
    )
    wire += DONE
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=20))
    events = decode_all(wire, cuts)
    decoded = [json.loads(e.data)["content"] for e in events[:-1]]
    assert decoded == texts
    assert all("\ufffd" not in t for t in decoded)
    assert events[-1].data == b"[DONE]"


def test_raw_line_separator_inside_json_is_not_a_line_end() -> None:
    payload = '{"content": "a\u2028b\u2029c\x85d"}'.encode()
    events = decode_all(b"data: " + payload + b"\n\n", [8, 9, 10])
    assert len(events) == 1
    assert json.loads(events[0].data)["content"] == "a\u2028b\u2029c\x85d"


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\r") == [SSEEvent(b"a")]
    assert decoder.feed(b"\ndata: b\n\n") == [SSEEvent(b"b")]


def test_unterminated_line_is_bounded() -> None:
    decoder = SSEDecoder(max_line_bytes=16)
    with pytest.raises(SSEDecodeError):
        decoder.feed(b"data: " + b"x" * 32)


@pytest.mark.parametrize("lines", [1, 2, 7])
def test_one_event_is_bounded_in_bytes_at_exactly_the_limit(lines: int) -> None:
    limit = 100
    # `lines` data lines whose joined value (with the newlines between them) is `limit` bytes.
    sizes = [limit // lines] * lines
    sizes[-1] += limit - sum(sizes) - (lines - 1)
    wire = b"".join(b"data: " + b"x" * n + b"\n" for n in sizes)
    decoder = SSEDecoder(max_event_bytes=limit)
    assert decoder.feed(wire + b"\n") == [SSEEvent(data=b"\n".join(b"x" * n for n in sizes))]
    with pytest.raises(SSEDecodeError, match="SSE event exceeded 100 bytes"):
        SSEDecoder(max_event_bytes=limit).feed(wire.replace(b"x", b"xy", 1) + b"\n")


def test_data_lines_that_never_end_an_event_raise_before_memory_grows() -> None:
    """An upstream streaming ``data:`` lines with no blank line: each line is short, so only the
    event bound can stop it; what the decoder held when it raised is within the bound."""
    decoder = SSEDecoder(max_line_bytes=1 << 10, max_event_bytes=1 << 16)
    line = b"data: " + b"z" * 1000 + b"\n"
    fed = 0
    with pytest.raises(SSEDecodeError, match="event exceeded"):
        for _ in range(10_000):
            decoder.feed(line)
            fed += 1
    assert fed == (1 << 16) // 1001
    assert sum(len(part) for part in decoder._data) <= 1 << 16


def test_the_event_bound_resets_with_each_event() -> None:
    decoder = SSEDecoder(max_event_bytes=10)
    for _ in range(100):
        assert decoder.feed(b"data: 0123456789\n\n") == [SSEEvent(data=b"0123456789")]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300)
@given(JSON_VALUES, st.sampled_from([(",", ":"), (", ", ": ")]), st.sampled_from(["", " ", "\n"]))
def test_json_data_reads_what_json_loads_reads(
    value: object, separators: tuple[str, str], pad: str
) -> None:
    data = (pad + json.dumps(value, separators=separators, ensure_ascii=False) + pad).encode()
    assert json_data(data) == json.loads(data)


@settings(max_examples=300)
@example(b"\x000")
@example(b"20000000000000000000")  # past 64 bits: orjson made it a float, json an int
@example(b"[1e999]")  # past a double: json reads inf
@given(st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_json_data_refuses_what_json_loads_refuses(data: bytes) -> None:
    # SSE is UTF-8: the reference is json.loads of the data read as UTF-8. (json.loads(bytes)
    # would also sniff UTF-16 and UTF-32, so it reads b"\x000" as "0"; an SSE stream cannot.)
    try:
        expected = json.loads(data.decode())
    except ValueError:
        with pytest.raises(ValueError):
            json_data(data)
    else:
        # Compared as JSON text: NaN, which both accept, is not equal to itself.
        assert json.dumps(json_data(data)) == json.dumps(expected)


@pytest.mark.parametrize(
    "data",
    [b'{"a": 1} {"b": 2}', b'{"a": 1}x', b"", b"\xff{}", b'{"a": }', b"[1,]"],
)
def test_json_data_names_the_problem_as_json_does(data: bytes) -> None:
    with pytest.raises(ValueError) as ours:
        json_data(data)
    with pytest.raises(ValueError) as theirs:
        json.loads(data)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
