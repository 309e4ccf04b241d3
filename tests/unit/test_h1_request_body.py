"""A request's body as ``http1/request.py`` reads it, by length or in chunks: where it ends
however its bytes are cut, the next request left after it, the body limit exactly at its bound,
malformed chunked bodies refused, and nothing but ``H1Error`` raised, whatever the bytes.

The messages this side writes are matched word for word; llhttp's refusals by status only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.h1_helpers import CHUNKED, LIMIT, chunked, parser_after, read_body, split_at
from trio_gateway.http1.errors import H1Error
from trio_gateway.http1.request import MAX_HEADERS, RequestParser, find_head_end


def test_a_length_body_across_reads_leaves_the_next_request() -> None:
    parser, _ = parser_after("POST / HTTP/1.1", "Host: gw", "Content-Length: 5")
    assert parser.body(b"") == ([], 0) and not parser.body_done
    assert parser.body(b"hel") == ([b"hel"], 3) and not parser.body_done
    assert parser.body(b"loGET / HTTP/1.1\r\n") == ([b"lo"], 2)
    assert parser.body_done
    assert parser.body(b"more") == ([], 0)


def test_a_chunked_body_ends_where_it_ends_and_leaves_the_next_request() -> None:
    parser, _ = parser_after("POST / HTTP/1.1", "Host: gw", CHUNKED)
    wire = b"5\r\nhello\r\n0\r\n\r\n"
    assert parser.body(wire + b"GET / HTTP/1.1\r\n") == ([b"hello"], len(wire))
    assert parser.body_done


def test_chunk_data_is_passed_on_as_it_arrives() -> None:
    parser, _ = parser_after("POST / HTTP/1.1", "Host: gw", CHUNKED)
    assert parser.body(b"a\r\nhello") == ([b"hello"], 8)
    assert parser.body(b"world\r\n") == ([b"world"], 7) and not parser.body_done
    assert parser.body(b"0\r\n\r\n") == ([], 5) and parser.body_done


def test_trailers_and_extensions_are_read_and_not_kept() -> None:
    parser, parsed = parser_after("POST / HTTP/1.1", "Host: gw", CHUNKED)
    wire = b'5;a=1;b="two"\r\nhello\r\n0\r\nX-Checksum: abc\r\nX-More: 1\r\n\r\n'
    assert read_body(parser, [wire + b"NEXT"]) == (b"hello", len(wire), b"NEXT")
    assert parsed.headers == [(b"host", b"gw"), (b"transfer-encoding", b"chunked")]


def test_trailers_do_not_count_as_header_lines() -> None:
    lines = ["POST / HTTP/1.1", "Host: gw", CHUNKED] + ["X-H: v"] * (MAX_HEADERS - 2)
    parser, _ = parser_after(*lines)
    wire = b"0\r\n" + b"X-T: v\r\n" * 10 + b"\r\n"
    assert read_body(parser, [wire]) == (b"", len(wire), b"")


def test_requests_one_after_another_on_one_parser() -> None:
    wire = (
        b"POST /a HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\n\r\nabc"
        b"POST /b HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n3\r\ndef\r\n0\r\n\r\n"
        b"GET /c HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
        b"GET /d HTTP/1.1\r\nHost: gw\r\n\r\n"
    )
    parser = RequestParser(max_body_bytes=LIMIT)
    seen = []
    while wire:
        end = find_head_end(wire)
        assert end is not None
        parsed = parser.head(wire[:end])
        body, _, wire = read_body(parser, [wire[end:]])
        names = [name for name, _ in parsed.headers]  # nothing of the request before
        seen.append((parsed.method, parsed.target, parsed.http_version, names, body))
    assert seen == [
        ("POST", b"/a", "1.1", [b"host", b"content-length"], b"abc"),
        ("POST", b"/b", "1.1", [b"host", b"transfer-encoding"], b"def"),
        ("GET", b"/c", "1.0", [b"connection"], b""),
        ("GET", b"/d", "1.1", [b"host"], b""),
    ]


def test_a_chunked_body_may_reach_the_limit_but_not_pass_it() -> None:
    parser, _ = parser_after("POST / HTTP/1.1", "Host: gw", CHUNKED)
    whole = chunked([b"a" * 600, b"b" * (LIMIT - 600)])
    assert read_body(parser, [whole]) == (b"a" * 600 + b"b" * (LIMIT - 600), len(whole), b"")
    # One byte more, a byte at a time: refused at the byte past the limit, not before.
    parser, _ = parser_after("POST / HTTP/1.1", "Host: gw", CHUNKED)
    over = chunked([b"a" * 600, b"b" * (LIMIT - 599)])
    at = over.index(b"b" * (LIMIT - 599)) + LIMIT - 599  # the last body byte's end
    for i in range(at - 1):
        parser.body(over[i : i + 1])
    with pytest.raises(H1Error) as caught:
        parser.body(over[at - 1 : at])
    assert (caught.value.status, caught.value.message) == (
        413,
        f"request body is larger than the limit ({LIMIT} bytes)",
    )


def test_a_chunk_declared_larger_than_the_limit_is_refused_as_its_bytes_pass_it() -> None:
    parser, _ = parser_after("POST / HTTP/1.1", "Host: gw", CHUNKED)
    assert parser.body(b"ffffffffffffffff\r\n") == ([], 18)
    assert parser.body(b"a" * LIMIT) == ([b"a" * LIMIT], LIMIT)
    with pytest.raises(H1Error) as caught:
        parser.body(b"a")
    assert caught.value.status == 413


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"zz\r\n", "not a chunk size: b'zz\\r\\n'"),
        (b"+5\r\nhello\r\n0\r\n\r\n", "not a chunk size: b'+5\\r\\n'"),
        (b"0" * 16 + b"5\r\nhello\r\n0\r\n\r\n", "not a chunk size: b'00000000000000005\\r\\n'"),
        (b"0" * 24 + b"5\r\nhello\r\n0\r\n\r\n", None),
        (b"5 \r\nhello\r\n0\r\n\r\n", None),
        (b"5\r\nhelloX\r\n0\r\n\r\n", None),
        (b"5\r\nhello\n0\r\n\r\n", None),
        (b"5\r\nhello\r0\r\n\r\n", None),
        (b"5\nhello\n0\n\n", None),
        (b"5\r\nhello\r\n0\n\r\n", None),
        (b"5\r\nhello\r\n0\r\n\n", None),
        (b"5; ext=1\r\nhello\r\n0\r\n\r\n", None),
        (b"0\r\nnot a field\r\n\r\n", None),
        (b"0\r\nX-T: a\x00b\r\n\r\n", None),
        (b"0\r\nX-T: a\r\n b\r\n\r\n", None),
        (b"0\r\nGET / HTTP/1.1\r\nHost: gw\r\n\r\n", None),
    ],
)
def test_a_malformed_chunked_body_is_refused(wire: bytes, message: str | None) -> None:
    parser, _ = parser_after("POST / HTTP/1.1", "Host: gw", CHUNKED)
    with pytest.raises(H1Error) as caught:
        read_body(parser, [wire])
    assert caught.value.status == 400
    if message is not None:
        assert caught.value.message == message


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=300), max_size=8),
    st.lists(st.integers(min_value=0), max_size=20),
    st.sampled_from([b"", b";ext=1", b';name="v"', b";a;b=c"]),
    st.sampled_from([b"", b"X-Checksum: abc\r\n", b"A: 1\r\nB: 2\r\n"]),
    st.binary(max_size=20),
)
def test_a_chunked_request_body_is_the_same_however_it_is_cut(
    parts: list[bytes], cuts: list[int], extension: bytes, trailer: bytes, after: bytes
) -> None:
    wire = chunked(parts, extension, trailer)
    parser, _ = parser_after("POST / HTTP/1.1", "Host: gw", CHUNKED, limit=10_000)
    assert read_body(parser, split_at(wire + after, cuts)) == (b"".join(parts), len(wire), after)
    assert parser.body_done


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(min_value=0), max_size=10))
def test_a_length_body_is_the_same_however_it_is_cut(data: bytes, cuts: list[int]) -> None:
    parser, _ = parser_after("POST / HTTP/1.1", "Host: gw", "Content-Length: 200")
    wire = (data * 2 + b"x" * 200)[:200]
    after = data[:20]
    assert read_body(parser, split_at(wire + after, cuts)) == (wire, 200, after)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=8))
def test_any_bytes_as_a_chunked_body_give_a_body_or_the_one_error(reads: list[bytes]) -> None:
    parser, _ = parser_after("POST / HTTP/1.1", "Host: gw", CHUNKED)
    try:
        read_body(parser, reads)  # which checks each read's `used`
    except H1Error as exc:
        assert exc.status in (400, 413, 431)
