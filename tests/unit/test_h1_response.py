"""An upstream's response (``http1/response.py``): the head whatever the reads, 1xx heads skipped,
bodies framed by length, chunks or the connection's end however they are cut, content codings
decoded or refused, the bounds at their limit, bytes after the response noticed.

The messages this side writes are matched word for word; llhttp's refusals by type only (its
words are its own, and change between versions)."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.http1.errors import H1Error
from trio_gateway.http1.response import (
    MAX_DECODED_BYTES_PER_READ,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    ResponseHead,
    ResponseParser,
)

READ_BYTES = 16 * 1024  # what the client reads at a time


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


def reads_of(data: bytes, size: int = READ_BYTES) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def response(head: bytes, *lines: bytes, body: bytes = b"") -> bytes:
    """A status line, header lines and the blank line, then ``body``."""
    return b"".join(line + b"\r\n" for line in (head, *lines)) + b"\r\n" + body


def read(reads: list[bytes], *, eof: bool = False) -> tuple[ResponseHead, bytes, ResponseParser]:
    """As the client reads: the head, then the body's pieces after every read (and the end of the
    connection, with ``eof``). → the head, the body and the parser."""
    parser = ResponseParser()
    head = None
    body: list[bytes] = []
    for data in reads:
        got = parser.feed(data)
        if head is not None:
            assert got is head  # the same head again on later calls
        head = got
        if head is not None:
            body += parser.pieces()
    if eof:
        parser.eof()
        body += parser.pieces()
    assert head is not None
    return head, b"".join(body), parser


def refusal(reads: list[bytes], *, eof: bool = False) -> H1Error:
    with pytest.raises(H1Error) as caught:
        read(reads, eof=eof)
    assert caught.value.status == 400  # the client makes every one an upstream protocol error
    return caught.value


OK = b"HTTP/1.1 200 OK"
CHUNKED = b"Transfer-Encoding: chunked"


# --- heads ------------------------------------------------------------------------------------


def test_a_head_after_informational_heads() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: te") is None
    head = parser.feed(b"xt/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
    assert head is not None and head.status == 200 and head.reason == "OK"
    assert head.get("content-type") == "text/event-stream"
    assert not head.http10 and head.keep_alive
    assert parser.pieces() == [b"hel"] and not parser.done and not parser.until_close
    assert parser.feed(b"lo\r\n0\r\n\r\n") is head
    assert parser.pieces() == [b"lo"] and parser.done and not parser.extra


def test_informational_heads_are_skipped_with_their_headers() -> None:
    head, body, parser = read(
        [
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
            b"HTTP/1.1 150 Unknown\r\n\r\nHTTP/1.1 199 Unknown\r\n\r\n"
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        ]
    )
    assert (head.status, head.headers, body) == (200, (("content-length", "2"),), b"ok")
    assert parser.done and not parser.extra


def test_a_head_byte_by_byte() -> None:
    wire = response(b"HTTP/1.1 100 Continue") + response(OK, b"Content-Length: 2", body=b"ok")
    head, body, parser = read([wire[i : i + 1] for i in range(len(wire))])
    assert (head.status, body, parser.done, parser.extra) == (200, b"ok", True, False)


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\n\r\n",
    ],
)
def test_101_is_refused(wire: bytes) -> None:
    assert refusal([wire]).message == (
        "101 Switching Protocols, to a request that asked for no upgrade"
    )


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close", False),
        (b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, CLOSE", False),
        (b"HTTP/1.0 200 OK", False),
        (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive", True),
        (b"HTTP/1.0 200 OK\r\nConnection: x, keep-alive", True),
    ],
)
def test_keep_alive(head: bytes, keep_alive: bool) -> None:
    parsed, _, _ = read([head + b"\r\nContent-Length: 0\r\n\r\n"])
    assert parsed.keep_alive is keep_alive
    assert parsed.http10 is head.startswith(b"HTTP/1.0")


def test_a_head_of_a_status_line_alone_keeps_its_whole_reason() -> None:
    head, _, _ = read([b"HTTP/1.1 204 No Content\r\n\r\n"])
    assert (head.status, head.reason, head.headers) == (204, "No Content", ())
    assert head.get("content-length") is None
    head, _, _ = read([b"HTTP/1.1 200 Very Fine Indeed\r\nContent-Length: 0\r\n\r\n"])
    assert head.reason == "Very Fine Indeed"
    head, _, _ = read([b"HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n"])
    assert (head.status, head.reason) == (404, "")


def test_header_values_without_the_whitespace_around_them() -> None:
    head, _, _ = read([response(OK, b"X-A:  spaced \t", b"X-B:", b"Content-Length: 0")])
    assert head.headers == (("x-a", "spaced"), ("x-b", ""), ("content-length", "0"))
    assert (head.get("x-a"), head.get("x-b"), head.get("x-c")) == ("spaced", "", None)


@pytest.mark.parametrize(
    "wire",
    [
        b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
        b"HTTX/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n x: v\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n: v\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n",
        b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
    ],
)
def test_a_malformed_head_is_refused(wire: bytes) -> None:
    refusal([wire])


def test_http_2_is_refused() -> None:
    assert refusal([b"HTTP/2.0 200 OK\r\n\r\n"]).message == ("not an HTTP/1.x response: HTTP/2.0")


def test_exactly_max_headers_is_allowed_one_more_is_not() -> None:
    lines = [b"x-h: v"] * (MAX_HEADERS - 1) + [b"Content-Length: 0"]
    head, _, _ = read([response(OK, *lines)])
    assert len(head.headers) == MAX_HEADERS
    error = refusal([response(OK, b"x-h: v", *lines)])
    assert error.message == f"more than {MAX_HEADERS} header lines"


def test_the_headers_of_a_1xx_head_do_not_count() -> None:
    early = response(b"HTTP/1.1 103 Early Hints", *[b"Link: x"] * MAX_HEADERS)
    lines = [b"x-h: v"] * (MAX_HEADERS - 1) + [b"Content-Length: 0"]
    head, _, _ = read([early + response(OK, *lines)])
    assert len(head.headers) == MAX_HEADERS


def test_the_head_bound_is_exact() -> None:
    """A head of MAX_HEAD_BYTES, its blank line included, is read; one byte more is not, whole
    or unfinished, in one read or in several."""
    start = b"HTTP/1.1 200 OK\r\nx-f: "
    filler = start + b"a" * (MAX_HEAD_BYTES - len(start) - 4)
    whole = filler + b"\r\n\r\n"
    assert len(whole) == MAX_HEAD_BYTES
    for reads in ([whole], [filler, b"\r\n\r\n"], [whole[:100], whole[100:]]):
        head, _, parser = read(reads, eof=True)
        assert len(head.get("x-f") or "") == MAX_HEAD_BYTES - len(start) - 4
        assert parser.done and parser.until_close
    longer = filler + b"a\r\n\r\n"
    for reads in ([longer], [filler, b"a\r\n\r\n"], [filler + b"a", b"\r\n\r\n"]):
        with pytest.raises(H1Error) as caught:
            read(reads)
        assert caught.value.message == f"a response head larger than {MAX_HEAD_BYTES} bytes"
    # Unfinished: MAX_HEAD_BYTES are kept, one more is not.
    parser = ResponseParser()
    assert parser.feed(filler + b"aaaa") is None
    with pytest.raises(H1Error) as caught:
        parser.feed(b"a")
    assert caught.value.message == f"a response head larger than {MAX_HEAD_BYTES} bytes"


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=1, max_value=3 * READ_BYTES))
def test_a_head_without_end_is_refused_within_one_read_of_the_bound(size: int) -> None:
    endless = b"HTTP/1.1 200 OK\r\n" + b"x-filler: " + b"y" * (MAX_HEAD_BYTES + size) + b"\r\n"
    parser = ResponseParser()
    fed = 0
    with pytest.raises(H1Error) as caught:
        for data in reads_of(endless, size):
            assert parser.feed(data) is None
            fed += len(data)
    assert MAX_HEAD_BYTES < fed + size <= MAX_HEAD_BYTES + size
    assert caught.value.message == f"a response head larger than {MAX_HEAD_BYTES} bytes"


def test_blank_lines_before_a_head_are_bounded_too() -> None:
    parser = ResponseParser()
    assert parser.feed(b"\r\n" * (MAX_HEAD_BYTES // 2)) is None
    with pytest.raises(H1Error, match="a response head larger than"):
        parser.feed(b"\r\n")


@pytest.mark.parametrize(
    "framing",
    [
        b"Transfer-Encoding: chunked\r\n\r\n5;" + b"e" * 2 * MAX_HEAD_BYTES,
        b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: " + b"t" * 2 * MAX_HEAD_BYTES,
    ],
)
def test_a_run_of_framing_bytes_is_bounded(framing: bytes) -> None:
    with pytest.raises(H1Error) as caught:
        read(reads_of(b"HTTP/1.1 200 OK\r\n" + framing))
    assert (
        caught.value.message
        == f"a response run of framing bytes larger than {MAX_HEAD_BYTES} bytes"
    )


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


# --- content codings --------------------------------------------------------------------------

TEXT = b'data: {"choices": [{"delta": {"content": "hello"}}]}\n\n' * 50


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data)


def deflated(data: bytes) -> bytes:
    return zlib.compress(data)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["gzip", "x-gzip", "deflate", "GZip"]),
    st.booleans(),
    st.lists(st.integers(min_value=0), max_size=20),
)
def test_a_compressed_body_is_decoded_however_it_is_cut(
    encoding: str, in_chunks: bool, cuts: list[int]
) -> None:
    packed = deflated(TEXT) if encoding == "deflate" else gzipped(TEXT)
    if in_chunks:
        body = chunked([packed[i : i + 100] for i in range(0, len(packed), 100)])
        wire = response(OK, b"Content-Encoding: " + encoding.encode(), CHUNKED, body=body)
    else:
        length = b"Content-Length: %d" % len(packed)
        wire = response(OK, b"Content-Encoding: " + encoding.encode(), length, body=packed)
    _, body_out, parser = read(split_at(wire, cuts))
    assert (body_out, parser.done) == (TEXT, True)


def test_a_compressed_body_until_close_is_decoded() -> None:
    wire = response(OK, b"Content-Encoding: gzip", body=gzipped(TEXT))
    assert read(reads_of(wire, 7), eof=True)[1] == TEXT


def test_identity_is_no_coding() -> None:
    wire = response(OK, b"Content-Encoding: identity", b"Content-Length: 2", body=b"ok")
    assert read([wire])[1] == b"ok"


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, gzip", "gzip, br"])
def test_a_coding_that_cannot_be_decoded_is_refused(encoding: str) -> None:
    wire = response(OK, b"Content-Encoding: " + encoding.encode(), b"Content-Length: 2")
    error = refusal([wire + b"ok"])
    assert error.message == f"a content-encoding that cannot be decoded: {encoding.lower()!r}"


@pytest.mark.parametrize(
    "lines",
    [
        [b"Content-Encoding: gzip", b"Content-Encoding: identity"],
        [b"Content-Encoding: gzip", b"Content-Encoding:"],
        [b"Content-Encoding: identity", b"Content-Encoding: gzip"],
        [b"Content-Encoding: gzip, identity"],
    ],
)
def test_content_codings_on_two_lines_are_one_list(lines: list[bytes]) -> None:
    """ "gzip" then "identity" is "gzip, identity" (RFC 9110 section 5.3), whose only coding is
    gzip: decoded, never passed on as the compressed bytes."""
    packed = gzipped(b"hello")
    wire = response(OK, *lines, b"Content-Length: %d" % len(packed), body=packed)
    assert read([wire])[1] == b"hello"


def test_two_codings_on_two_lines_are_refused() -> None:
    wire = response(OK, b"Content-Encoding: gzip", b"Content-Encoding: br", b"Content-Length: 2")
    error = refusal([wire + b"ok"])
    assert error.message == "a content-encoding that cannot be decoded: 'gzip, br'"


def test_a_gzip_bomb_is_refused() -> None:
    """100 MB of zeros, some 100 KB compressed: refused at the first read that decodes to more
    than MAX_DECODED_BYTES_PER_READ, without decoding it all."""
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    zeros = bytes(1024 * 1024)
    packed = b"".join(packer.compress(zeros) for _ in range(100)) + packer.flush()
    assert len(packed) < 200_000
    wire = response(OK, b"Content-Encoding: gzip", b"Content-Length: %d" % len(packed))
    with pytest.raises(H1Error) as caught:
        read(reads_of(wire + packed))
    assert caught.value.message == (
        "a compressed body that decodes to more than "
        f"{MAX_DECODED_BYTES_PER_READ} bytes from one read"
    )


@pytest.mark.parametrize("extra", [0, 1])
def test_the_decoded_bound_is_exact(extra: int) -> None:
    packed = gzipped(bytes(MAX_DECODED_BYTES_PER_READ + extra))
    wire = response(OK, b"Content-Encoding: gzip", b"Content-Length: %d" % len(packed))
    parser = ResponseParser()
    assert parser.feed(wire + packed) is not None
    if extra:
        with pytest.raises(H1Error, match="decodes to more than"):
            parser.pieces()
    else:
        assert sum(len(p) for p in parser.pieces()) == MAX_DECODED_BYTES_PER_READ
        assert parser.done


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_a_truncated_compressed_body_is_refused_at_its_end(framing: str) -> None:
    packed = gzipped(TEXT)[:-5]
    lines = [b"Content-Encoding: gzip"]
    if framing == "length":
        lines.append(b"Content-Length: %d" % len(packed))
        body = packed
    elif framing == "chunked":
        lines.append(CHUNKED)
        body = chunked([packed])
    else:
        body = packed
    error = refusal(reads_of(response(OK, *lines, body=body), 50), eof=framing == "close")
    assert error.message == "a compressed body that ends before its compressed stream does"


def test_a_body_that_is_not_what_its_coding_says_is_refused() -> None:
    wire = response(OK, b"Content-Encoding: gzip", b"Content-Length: 5", body=b"hello")
    assert refusal([wire]).message.startswith("a compressed body that does not decode: ")


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
def test_a_bodiless_response_may_name_a_content_coding(status: bytes) -> None:
    """A 304 repeats the headers of the representation it validates, Content-Encoding among
    them; neither it nor a 204 has a body to decode."""
    head, body, parser = read([response(b"HTTP/1.1 " + status, b"Content-Encoding: gzip")])
    assert (head.status, body, parser.done) == (int(status[:3]), b"", True)


@pytest.mark.parametrize("after", [gzipped(b" world"), b"junk"], ids=["a second member", "junk"])
def test_no_byte_after_a_compressed_stream_is_dropped_unseen(after: bytes) -> None:
    """A gzip body may hold several members (RFC 1952); what follows the first is either
    decoded or refused, never silently dropped."""
    packed = gzipped(b"hello") + after
    wire = response(OK, b"Content-Encoding: gzip", b"Content-Length: %d" % len(packed), body=packed)
    try:
        _, body, _ = read([wire])
    except H1Error:
        return
    assert body == b"hello world"


# --- the head's headers -----------------------------------------------------------------------


def test_a_head_made_from_its_headers() -> None:
    head = ResponseHead.from_headers(
        503, "Service Unavailable", True, [(b"Retry-After", b" 5 "), (b"X-A", b"1")]
    )
    assert (head.status, head.reason, head.http10) == (503, "Service Unavailable", True)
    assert head.headers == (("retry-after", "5"), ("x-a", "1"))
    assert (head.get("retry-after"), head.get("x-a"), head.get("x")) == ("5", "1", None)
    assert not head.keep_alive
    empty = ResponseHead.from_headers(200, "OK", False, [])
    assert (empty.headers, empty.get("x-a"), empty.keep_alive) == ((), None, True)


_NAMES = st.sampled_from(
    ["Content-Type", "content-type", "Connection", "X-A", "x-a", "CONTENT-LENGTH", "a-content-type"]
)
_VALUES = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=20)
_LOOKED_UP = st.sampled_from(
    ["content-type", "x-a", "connection", "content-length", "type", "missing"]
)


def as_lines(headers: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((k.lower(), v.encode("latin-1").strip().decode("latin-1")) for k, v in headers)


def last_of(pairs: tuple[tuple[str, str], ...], name: str) -> str | None:
    found = None
    for key, value in pairs:
        if key == name:
            found = value
    return found


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=8), _LOOKED_UP)
def test_a_head_finds_each_header_as_the_list_of_its_lines_would(
    headers: list[tuple[str, str]], name: str
) -> None:
    """The head keeps its lines as bytes and searches them: the same answers as the pairs."""
    head = ResponseHead.from_headers(
        200, "OK", False, [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    )
    pairs = as_lines(headers)
    assert head.headers == pairs
    assert head.get(name) == last_of(pairs, name)


_WIRE_NAMES = st.sampled_from(["Content-Type", "content-type", "X-A", "x-a", "a-content-type"])
_WIRE_VALUES = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=255, exclude_characters="\x7f"),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(_WIRE_NAMES, _WIRE_VALUES), max_size=8),
    _LOOKED_UP,
    st.sampled_from([":", ": ", ":\t ", ":  "]),
)
def test_a_parsed_head_finds_each_header_as_the_list_of_its_lines_would(
    headers: list[tuple[str, str]], name: str, colon: str
) -> None:
    block = "HTTP/1.1 200 OK" + "".join(f"\r\n{k}{colon}{v}" for k, v in headers)
    head, _, _ = read([block.encode("latin-1") + b"\r\nContent-Length: 0\r\n\r\n"])
    pairs = (*as_lines(headers), ("content-length", "0"))
    assert head.headers == pairs
    assert head.get(name) == last_of(pairs, name)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=100), max_size=6), st.booleans())
def test_any_bytes_give_a_response_or_the_one_error(reads: list[bytes], eof: bool) -> None:
    parser = ResponseParser()
    try:
        for data in [b"HTTP/1.1 200 OK\r\n", *reads]:
            parser.feed(data)
            parser.pieces()
        if eof:
            parser.eof()
            parser.pieces()
    except H1Error as exc:
        assert exc.message
