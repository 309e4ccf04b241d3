"""An upstream's response head (``http1/response.py``): the head whatever the reads, 1xx heads
skipped, the bounds at their limit, its headers looked up as the list of its lines would, and
nothing but ``H1Error`` raised whatever the bytes. Bodies: test_h1_response_body.py; content
codings: test_h1_response_coding.py.

The messages this side writes are matched word for word; llhttp's refusals by type only (its
words are its own, and change between versions)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.h1_response_helpers import OK, READ_BYTES, read, reads_of, refusal, response
from trio_gateway.http1.errors import H1Error
from trio_gateway.http1.response import MAX_HEAD_BYTES, MAX_HEADERS, ResponseHead, ResponseParser

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
