"""The HTTP/1.1 framing (``providers/h1.py``) at its edges: which responses have no body, the
transfer-encoding rule, every refusal's exact words, the bounds exactly at their limit.

Written for mutation testing (docs/testing.md): each case kills a mutant the e2e tests let live.
"""

from __future__ import annotations

import pytest

from trio_gateway.providers.h1 import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    ChunkedBody,
    H1Error,
    HeadReader,
    LengthBody,
    ResponseHead,
    body_reader,
    parse_head,
)


def head(status: int, *headers: tuple[str, str]) -> ResponseHead:
    return ResponseHead(status=status, reason="", http10=False, headers=headers)


LENGTH = ("content-length", "5")


@pytest.mark.parametrize(
    ("status", "head_request", "empty"),
    [
        (204, False, True),
        (304, False, True),
        (100, False, True),
        (150, False, True),
        (200, True, True),
        (200, False, False),
        (305, False, False),
        (99, False, False),
    ],
)
def test_which_responses_have_no_body(status: int, head_request: bool, empty: bool) -> None:
    reader = body_reader(head(status, LENGTH), head_request=head_request)
    assert isinstance(reader, LengthBody)
    assert reader.done is empty
    assert reader.feed(b"hello") == ([] if empty else [b"hello"])


@pytest.mark.parametrize(
    ("encoding", "chunked"),
    [
        ("chunked", True),
        ("gzip, chunked", True),
        ("gzip,chunked", True),
        ("a,b,chunked", True),
        ("chunked, gzip", False),
        ("gzip", False),
    ],
)
def test_chunked_must_be_the_last_transfer_coding(encoding: str, chunked: bool) -> None:
    te = ("transfer-encoding", encoding)
    if chunked:
        assert isinstance(body_reader(head(200, te)), ChunkedBody)
        return
    with pytest.raises(H1Error) as caught:
        body_reader(head(200, te))
    assert str(caught.value) == f"a transfer-encoding other than chunked: {encoding!r}"


def test_the_status_line_and_code_refusals_quote_a_bounded_prefix() -> None:
    line = b"HTTX/1.1 200 " + b"x" * 200
    with pytest.raises(H1Error) as caught:
        parse_head(line)
    assert str(caught.value) == f"not an HTTP/1.x status line: {line[:80]!r}"
    code = b"1" * 30
    with pytest.raises(H1Error) as caught:
        parse_head(b"HTTP/1.1 " + code + b" OK")
    assert str(caught.value) == f"not a status code: {code[:20]!r}"


def test_exactly_max_headers_is_allowed_one_more_is_not() -> None:
    lines = [b"HTTP/1.1 200 OK"] + [b"x-h: v"] * MAX_HEADERS
    assert len(parse_head(b"\r\n".join(lines)).headers) == MAX_HEADERS
    with pytest.raises(H1Error) as caught:
        parse_head(b"\r\n".join([*lines, b"x-h: v"]))
    assert str(caught.value) == f"more than {MAX_HEADERS} header lines"


@pytest.mark.parametrize("line", [b": value", b"garbage", b"bad name: v", b" x: v"])
def test_a_malformed_header_line_is_refused_word_for_word(line: bytes) -> None:
    with pytest.raises(H1Error) as caught:
        parse_head(b"HTTP/1.1 200 OK\r\n" + line)
    assert str(caught.value) == f"not a header line: {line[:80]!r}"
    long = b"y" * 200
    with pytest.raises(H1Error) as caught:
        parse_head(b"HTTP/1.1 200 OK\r\n" + long)
    assert str(caught.value) == f"not a header line: {long[:80]!r}"


@pytest.mark.parametrize("size", [b"+5", b"-5", b"0x5", b"0X5", b""])
def test_chunk_sizes_are_bare_hex(size: bytes) -> None:
    with pytest.raises(H1Error) as caught:
        ChunkedBody().feed(size + b"\r\nhello\r\n")
    assert str(caught.value) == f"not a chunk size: {size[:40]!r}"


def test_extensions_after_the_first_semicolon_are_ignored() -> None:
    body = ChunkedBody()
    assert body.feed(b"5;a=1;b=2\r\nhello\r\n0\r\n\r\n") == [b"hello"]
    assert body.done


def test_long_bad_lines_are_quoted_to_40_bytes() -> None:
    bad = b"z" * 100
    with pytest.raises(H1Error) as caught:
        ChunkedBody().feed(bad + b"\r\n")
    assert str(caught.value) == f"not a chunk size: {bad[:40]!r}"
    with pytest.raises(H1Error) as caught:
        ChunkedBody().feed(b"2\r\nab" + bad + b"\r\n")
    assert str(caught.value) == f"chunk data longer than its size: {bad[:40]!r}"


def test_a_head_reader_has_nothing_left_over_before_its_head() -> None:
    reader = HeadReader()
    assert reader.leftover == b""
    assert reader.feed(b"HTTP/1.1 200 OK\r\n") is None
    assert reader.leftover == b""


def test_the_head_bound_is_exact() -> None:
    # Exactly MAX_HEAD_BYTES of unfinished head is kept; a head that ends right at the bound
    # is read.
    reader = HeadReader()
    filler = b"HTTP/1.1 200 OK\r\nx-f: " + b"a" * (MAX_HEAD_BYTES - 22)
    assert len(filler) == MAX_HEAD_BYTES
    assert reader.feed(filler) is None
    assert reader.feed(b"\r\n\r\nbody") is not None
    assert reader.leftover == b"body"
    with pytest.raises(H1Error) as caught:
        HeadReader().feed(filler + b"a")
    assert str(caught.value) == f"a response head larger than {MAX_HEAD_BYTES} bytes"
    with pytest.raises(H1Error) as caught:
        HeadReader().feed(filler + b"a\r\n\r\n")
    assert str(caught.value) == f"a response head larger than {MAX_HEAD_BYTES} bytes"


def test_informational_heads_are_skipped_but_101_is_not() -> None:
    reader = HeadReader()
    got = reader.feed(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    )
    assert got is not None and got.status == 200 and reader.leftover == b"ok"
    switching = HeadReader().feed(b"HTTP/1.1 101 Switching\r\n\r\n")
    assert switching is not None and switching.status == 101


def test_an_empty_head_is_not_a_status_line() -> None:
    with pytest.raises(H1Error) as caught:
        HeadReader().feed(b"\r\n\r\n")
    assert str(caught.value) == "not an HTTP/1.x status line: b''"


def test_a_length_body_keeps_everything_after_it() -> None:
    body = LengthBody(3)
    assert body.feed(b"abcde") == [b"abc"]
    assert body.feed(b"fg") == []
    assert body.leftover == b"defg"
    assert body.done


def test_the_chunk_line_bound_is_exact() -> None:
    from trio_gateway.providers.h1 import MAX_LINE_BYTES

    # A size line with extensions of exactly MAX_LINE_BYTES is read, unfinished or whole.
    line = b"5;" + b"e" * (MAX_LINE_BYTES - 2)
    body = ChunkedBody()
    assert body.feed(line) == []
    assert body.feed(b"\nhello\r\n0\r\n\r\n") == [b"hello"]
    assert ChunkedBody().feed(line + b"\nhello") == [b"hello"]
    for fed in (line + b"e", line + b"e\r\n"):
        with pytest.raises(H1Error) as caught:
            ChunkedBody().feed(fed)
        assert str(caught.value) == f"a chunk line longer than {MAX_LINE_BYTES} bytes"


def test_a_head_of_a_status_line_alone_keeps_its_whole_reason() -> None:
    head = parse_head(b"HTTP/1.1 204 No Content")
    assert (head.status, head.reason, head.headers) == (204, "No Content", ())
    assert head.get("content-length") is None
