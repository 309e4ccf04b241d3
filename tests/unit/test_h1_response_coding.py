"""An upstream's content codings (``http1/response.py``): gzip and deflate decoded however the
body is cut and framed, other codings refused, the decoded bound exact against a gzip bomb, and
no byte after a compressed stream dropped unseen.

The messages this side writes are matched word for word; llhttp's refusals by type only (its
words are its own, and change between versions)."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.h1_helpers import chunked, split_at
from tests.unit.h1_response_helpers import CHUNKED, OK, read, reads_of, refusal, response
from trio_gateway.http1.errors import H1Error
from trio_gateway.http1.response import MAX_DECODED_BYTES_PER_READ, ResponseParser

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
