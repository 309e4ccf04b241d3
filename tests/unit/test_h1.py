"""HTTP/1.1 response parsing for the streaming path: heads, chunked and sized bodies, bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.providers.h1 import (
    MAX_HEAD_BYTES,
    MAX_LINE_BYTES,
    ChunkedBody,
    H1Error,
    HeadReader,
    LengthBody,
    body_reader,
    parse_head,
)


def chunked(parts: list[bytes], extension: bytes = b"", trailer: bytes = b"") -> bytes:
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in parts if p)
    return out + b"0\r\n" + trailer + b"\r\n"


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


@settings(max_examples=300)
@given(
    st.lists(st.binary(max_size=300), max_size=12),
    st.lists(st.integers(min_value=0), max_size=20),
    st.sampled_from([b"", b";ext=1", b'; name="v"']),
    st.sampled_from([b"", b"x-checksum: abc\r\n"]),
    st.binary(max_size=20),
)
def test_a_chunked_body_comes_back_whole_however_it_is_cut(
    parts: list[bytes], cuts: list[int], extension: bytes, trailer: bytes, after: bytes
) -> None:
    wire = chunked(parts, extension, trailer)
    body = ChunkedBody()
    got = []
    for piece in split_at(wire + after, cuts):
        got += body.feed(piece)
    assert b"".join(got) == b"".join(parts)
    assert body.done and body.leftover == after


def test_chunk_data_is_passed_on_as_it_arrives() -> None:
    body = ChunkedBody()
    assert body.feed(b"a\r\nhello") == [b"hello"]
    assert body.feed(b"world\r\n") == [b"world"] and not body.done
    assert body.feed(b"0\r\n\r\n") == [] and body.done


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"zz\r\n", "not a chunk size"),
        (b"-5\r\n", "not a chunk size"),
        (b"\r\n", "not a chunk size"),
        (b"3\r\nabcdef\r\n", "chunk data longer than its size"),
        (b"1" * (MAX_LINE_BYTES + 1), "a chunk line longer than"),
    ],
)
def test_a_malformed_chunked_body_is_named(wire: bytes, message: str) -> None:
    with pytest.raises(H1Error, match=message):
        ChunkedBody().feed(wire)


def test_an_endless_chunk_line_is_refused_across_feeds() -> None:
    body = ChunkedBody()
    with pytest.raises(H1Error, match="a chunk line longer than"):
        for _ in range(MAX_LINE_BYTES + 1):
            body.feed(b"1")


def test_a_head_after_informational_heads() -> None:
    reader = HeadReader()
    assert reader.feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: te") is None
    head = reader.feed(b"xt/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
    assert head is not None and head.status == 200 and head.reason == "OK"
    assert head.get("content-type") == "text/event-stream"
    assert reader.leftover == b"5\r\nhel"
    assert isinstance(body_reader(head), ChunkedBody) and head.keep_alive


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close", False),
        (b"HTTP/1.0 200 OK", False),
        (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive", True),
    ],
)
def test_keep_alive(head: bytes, keep_alive: bool) -> None:
    assert parse_head(head).keep_alive is keep_alive


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (b"SSH-2.0-OpenSSH_9.2", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 2000 OK", "not a status code"),
        (b"HTTP/1.1 200 OK\r\nno colon here", "not a header line"),
        (b"HTTP/1.1 200 OK\r\nbad name: x", "not a header line"),
    ],
)
def test_a_malformed_head_is_named(block: bytes, message: str) -> None:
    with pytest.raises(H1Error, match=message):
        parse_head(block)


def test_a_head_without_end_is_bounded() -> None:
    reader = HeadReader()
    reader.feed(b"HTTP/1.1 200 OK\r\n")
    with pytest.raises(H1Error, match="a response head larger than"):
        for _ in range(MAX_HEAD_BYTES // 1000 + 1):
            reader.feed(b"x-filler: " + b"y" * 990 + b"\r\n")


def test_body_framing() -> None:
    sized = body_reader(parse_head(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 5"))
    assert isinstance(sized, LengthBody)
    assert sized.feed(b"abc") == [b"abc"] and sized.feed(b"deXY") == [b"de"]
    assert sized.done and sized.leftover == b"XY"
    assert body_reader(parse_head(b"HTTP/1.1 200 OK")) is None  # until the connection ends
    empty = body_reader(parse_head(b"HTTP/1.1 204 No Content"))
    assert isinstance(empty, LengthBody) and empty.done
    with pytest.raises(H1Error, match="not a content-length"):
        body_reader(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: -1"))
    with pytest.raises(H1Error, match="other than chunked"):
        body_reader(parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip"))


_NAMES = st.sampled_from(
    ["Content-Type", "content-type", "Connection", "X-A", "x-a", "CONTENT-LENGTH", "a-content-type"]
)
_VALUES = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=20)


@given(
    st.lists(st.tuples(_NAMES, _VALUES), max_size=8),
    st.sampled_from(["content-type", "x-a", "connection", "content-length", "type", "missing"]),
)
def test_a_parsed_head_finds_each_header_as_the_list_of_its_lines_would(
    headers: list[tuple[str, str]], name: str
) -> None:
    """The head keeps its lines as bytes and searches them: the same answers as the pairs."""
    block = "HTTP/1.1 200 OK" + "".join(f"\r\n{k}:{v}" for k, v in headers)
    head = parse_head(block.encode("latin-1"))
    pairs = tuple((k.lower(), v.encode("latin-1").strip().decode("latin-1")) for k, v in headers)
    assert head.headers == pairs
    expected = None
    for key, value in pairs:
        if key == name:
            expected = value
    assert head.get(name) == expected
