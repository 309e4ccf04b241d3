"""An upstream's response body (``http1/response.py``): framed by length, chunks or the
connection's end however it is cut, which statuses have one, bytes after the response noticed,
and framing that is not chunked, or ambiguous, refused.

The messages this side writes are matched word for word; llhttp's refusals by type only (its
words are its own, and change between versions)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.h1_helpers import chunked, split_at
from tests.unit.h1_response_helpers import CHUNKED, OK, read, reads_of, refusal, response
from trio_gateway.http1.errors import H1Error
from trio_gateway.http1.response import MAX_HEAD_BYTES, ResponseParser

# --- bodies -----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
@pytest.mark.parametrize("lines", [[], [b"Content-Length: 5"], [CHUNKED]])
def test_204_and_304_have_no_body_whatever_their_head_says(
    status: bytes, lines: list[bytes]
) -> None:
    head, body, parser = read([response(b"HTTP/1.1 " + status, *lines)])
    assert (body, parser.done, parser.extra, parser.until_close) == (b"", True, False, False)
    assert head.status == int(status[:3])
    # What comes after is not its body: a server that talks out of turn.
    _, body, parser = read([response(b"HTTP/1.1 " + status, *lines, body=b"hello")])
    assert (body, parser.done, parser.extra) == (b"", True, True)


@pytest.mark.parametrize("status", [200, 203, 305, 400, 503, 599])
def test_other_statuses_have_their_body(status: int) -> None:
    wire = response(b"HTTP/1.1 %d X" % status, b"Content-Length: 5", body=b"hello")
    assert read([wire])[1] == b"hello"


def test_a_length_body_and_what_comes_after_it() -> None:
    parser = ResponseParser()
    head = parser.feed(response(b"HTTP/1.1 400 Bad Request", b"Content-Length: 5", body=b"abc"))
    assert head is not None and parser.pieces() == [b"abc"] and not parser.done
    assert parser.feed(b"de") is head and parser.pieces() == [b"de"]
    assert parser.done and not parser.extra and not parser.until_close
    parser.eof()  # the connection may end once the body has
    assert parser.feed(b"") is head and not parser.extra
    assert parser.feed(b"XY") is head and parser.extra and parser.pieces() == []


@pytest.mark.parametrize(
    "after",
    [b"X", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b"0\r\n\r\n"],
)
def test_bytes_after_the_response_in_its_read_are_noticed(after: bytes) -> None:
    for lines, body in [
        ([b"Content-Length: 2"], b"ok"),
        ([CHUNKED], b"2\r\nok\r\n0\r\n\r\n"),
        ([b"Content-Length: 0"], b""),
    ]:
        head, got, parser = read([response(OK, *lines, body=body + after)])
        assert (got, parser.done, parser.extra) == (b"ok" if body else b"", True, True)
        assert head.status == 200


@pytest.mark.parametrize("http", [b"HTTP/1.1 200 OK\r\nConnection: close", b"HTTP/1.0 200 OK"])
def test_bytes_after_a_closing_response_are_noticed_whatever_the_reads(http: bytes) -> None:
    """After a response that ends its connection, as after any other: ``extra``, never a
    refusal of the response itself, in the same read as in the next."""
    wire = http + b"\r\nContent-Length: 2\r\n\r\nokX"
    for cut in (len(wire) - 1, len(wire)):
        _, body, parser = read(split_at(wire, [cut]))
        assert (body, parser.done, parser.extra) == (b"ok", True, True)


def test_a_body_until_the_connection_ends() -> None:
    for http in (b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK"):
        parser = ResponseParser()
        assert parser.feed(http + b"\r\n\r\nabc") is not None
        assert parser.until_close and not parser.done
        assert parser.pieces() == [b"abc"]
        parser.feed(b"def")
        assert parser.pieces() == [b"def"] and not parser.done
        parser.eof()
        assert parser.done and parser.pieces() == [] and not parser.extra


@pytest.mark.parametrize(
    "reads",
    [
        [response(OK, b"Content-Length: 5", body=b"abc")],
        [response(OK, CHUNKED, body=b"5\r\nhello\r\n")],
        [response(OK, CHUNKED, body=b"5\r\nhel")],
        [response(OK, CHUNKED, body=b"0\r\nX-T: 1\r\n")],
    ],
)
def test_a_body_cut_short_by_the_end_of_the_connection(reads: list[bytes]) -> None:
    assert refusal(reads, eof=True).message == "connection lost (the body ended before its end)"


@pytest.mark.parametrize("reads", [[], [b"HTTP/1.1 200 OK\r\n"]])
def test_a_connection_ended_before_the_head_is_refused(reads: list[bytes]) -> None:
    parser = ResponseParser()
    for data in reads:
        assert parser.feed(data) is None
    with pytest.raises(H1Error) as caught:
        parser.eof()
    assert caught.value.message == "connection lost (the body ended before its end)"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=300), max_size=10),
    st.lists(st.integers(min_value=0), max_size=20),
    st.sampled_from([b"", b";ext=1", b';name="v"']),
    st.sampled_from([b"", b"x-checksum: abc\r\n"]),
)
def test_a_chunked_body_comes_back_whole_however_it_is_cut(
    parts: list[bytes], cuts: list[int], extension: bytes, trailer: bytes
) -> None:
    wire = response(OK, CHUNKED, body=chunked(parts, extension, trailer))
    head, body, parser = read(split_at(wire, cuts))
    assert body == b"".join(parts)
    assert parser.done and not parser.extra and not parser.until_close
    assert head.get("x-checksum") is None  # a trailer is not a header


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=500), st.lists(st.integers(min_value=0), max_size=20))
def test_a_length_body_comes_back_whole_however_it_is_cut(data: bytes, cuts: list[int]) -> None:
    wire = response(OK, b"Content-Length: %d" % len(data), body=data)
    _, body, parser = read(split_at(wire, cuts))
    assert (body, parser.done, parser.extra) == (data, True, False)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=500), st.lists(st.integers(min_value=0), max_size=20))
def test_a_body_until_close_comes_back_whole_however_it_is_cut(
    data: bytes, cuts: list[int]
) -> None:
    wire = response(OK, b"Content-Type: text/plain", body=data)
    _, body, parser = read(split_at(wire, cuts), eof=True)
    assert (body, parser.done, parser.extra) == (data, True, False)


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_a_body_far_longer_than_the_head_bound_is_no_run_of_framing_bytes(framing: str) -> None:
    """The bound is on bytes that are not body: body bytes, however many, are progress."""
    data = bytes(range(256)) * (4 * MAX_HEAD_BYTES // 256)
    if framing == "length":
        wire = response(OK, b"Content-Length: %d" % len(data), body=data)
    elif framing == "chunked":
        wire = response(
            OK, CHUNKED, body=chunked([data[: 3 * MAX_HEAD_BYTES], data[3 * MAX_HEAD_BYTES :]])
        )
    else:
        wire = response(OK, body=data)
    _, body, parser = read(reads_of(wire), eof=framing == "close")
    assert (body, parser.done, parser.extra) == (data, True, False)


def test_chunk_extensions_after_the_first_semicolon_are_ignored() -> None:
    wire = response(OK, CHUNKED, body=b"5;a=1;b=2\r\nhello\r\n0\r\n\r\n")
    assert read([wire])[1] == b"hello"


@pytest.mark.parametrize(
    "body",
    [
        b"+5\r\nhello\r\n0\r\n\r\n",
        b"-5\r\nhello\r\n0\r\n\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"zz\r\n",
        b"\r\nhello\r\n0\r\n\r\n",
        b"3\r\nabcdef\r\n0\r\n\r\n",
        b"5\nhello\n0\n\n",
        b"0\r\nnot a field\r\n\r\n",
    ],
)
def test_a_malformed_chunked_body_is_refused(body: bytes) -> None:
    refusal([response(OK, CHUNKED, body=body)])


# --- framing refusals -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "coding", ["gzip", "gzip, chunked", "gzip,chunked", "a,b,chunked", "chunked, gzip"]
)
def test_a_transfer_coding_other_than_chunked_is_refused(coding: str) -> None:
    error = refusal([response(OK, b"Transfer-Encoding: " + coding.encode())])
    listed = ", ".join(c.strip() for c in coding.split(","))
    assert error.message == f"a transfer-encoding other than chunked: {listed!r}"


@pytest.mark.parametrize("coding", ["chunked", "Chunked", "CHUNKED"])
def test_chunked_in_any_case(coding: str) -> None:
    wire = response(OK, b"Transfer-Encoding: " + coding.encode(), body=b"2\r\nok\r\n0\r\n\r\n")
    assert read([wire])[1] == b"ok"


@pytest.mark.parametrize(
    "lines",
    [
        [b"Transfer-Encoding: gzip", CHUNKED],
        [CHUNKED, CHUNKED],
    ],
)
def test_transfer_codings_on_two_lines_are_one_list(lines: list[bytes]) -> None:
    """RFC 9110 section 5.3: field lines of one name are one comma-separated list; "gzip" then
    "chunked" is "gzip, chunked", refused on one line and so on two."""
    with pytest.raises(H1Error):
        read([response(OK, *lines, body=b"2\r\nok\r\n0\r\n\r\n")])


@pytest.mark.parametrize(
    "lines",
    [
        [b"Content-Length: 5", CHUNKED],
        [CHUNKED, b"Content-Length: 5"],
        [b"Content-Length: 5", b"Content-Length: 5"],
        [b"Content-Length: 5", b"Content-Length: 6"],
    ],
)
def test_ambiguous_framing_is_refused(lines: list[bytes]) -> None:
    refusal([response(OK, *lines, body=b"hello")])
