"""A client's request head (``http1/request.py``): what is accepted, what is refused with which
status, the bounds exactly at their limit, where a head ends, and that nothing but ``H1Error`` is
ever raised, whatever the bytes. Bodies: test_h1_request_body.py.

The messages this side writes are matched word for word; llhttp's refusals by type and status
only (its words are its own, and change between versions)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.h1_helpers import CHUNKED, LIMIT, head, parser_after, read_body
from trio_gateway.http1.errors import H1Error
from trio_gateway.http1.request import (
    H2_PREFACE,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_LENGTH_DIGITS,
    RequestHead,
    RequestParser,
    find_head_end,
)


def parse(*lines: str) -> RequestHead:
    return parser_after(*lines)[1]


def refusal(block: bytes, limit: int = LIMIT) -> H1Error:
    with pytest.raises(H1Error) as caught:
        RequestParser(max_body_bytes=limit).head(block)
    return caught.value


# --- heads ------------------------------------------------------------------------------------


def test_a_post_with_a_length() -> None:
    parser, parsed = parser_after(
        "POST /v1/chat/completions?x=1 HTTP/1.1", "Host: gw", "Content-Length: 12"
    )
    assert parsed.method == "POST" and parsed.target == b"/v1/chat/completions?x=1"
    assert parsed.http_version == "1.1"
    assert parsed.headers == [(b"host", b"gw"), (b"content-length", b"12")]
    assert (parsed.framing, parsed.content_length) == ("length", 12)
    assert parsed.keep_alive and not parsed.expect_continue and not parsed.upgrade
    assert not parser.body_done


@pytest.mark.parametrize(
    ("lines", "framing", "length"),
    [
        (["GET / HTTP/1.1", "Host: gw"], "none", 0),
        (["GET / HTTP/1.0"], "none", 0),
        (["GET / HTTP/1.0", "Host: gw"], "none", 0),
        (["POST / HTTP/1.1", "Host: gw", "Content-Length: 0"], "none", 0),
        (["POST / HTTP/1.1", "Host: gw", "Content-Length: 5"], "length", 5),
        (["POST / HTTP/1.0", "Content-Length: 5"], "length", 5),
        (["POST / HTTP/1.1", "Host: gw", "Content-Length: " + "0" * 18 + "5"], "length", 5),
        (["POST / HTTP/1.1", "Host: gw", CHUNKED], "chunked", 0),
        (["POST / HTTP/1.1", "Host: gw", "Transfer-Encoding: Chunked"], "chunked", 0),
    ],
)
def test_body_framing(lines: list[str], framing: str, length: int) -> None:
    parser, parsed = parser_after(*lines)
    assert (parsed.framing, parsed.content_length) == (framing, length)
    assert parser.body_done is (framing == "none")


@pytest.mark.parametrize(
    ("lines", "keep_alive"),
    [
        (["GET / HTTP/1.1", "Host: gw"], True),
        (["GET / HTTP/1.1", "Host: gw", "Connection: close"], False),
        (["GET / HTTP/1.1", "Host: gw", "Connection: keep-alive, Close"], False),
        (["GET / HTTP/1.1", "Host: gw", "Connection: keep-alive", "Connection: close"], False),
        (["GET / HTTP/1.0"], False),
        (["GET / HTTP/1.0", "Connection: Keep-Alive"], True),
        (["GET / HTTP/1.0", "Connection: foo, keep-alive"], True),
        (["GET / HTTP/1.0", "Connection: keep-alive, close"], False),
        (["GET / HTTP/1.0", "Connection: keep-alive", "Connection: close"], False),
    ],
)
def test_keep_alive(lines: list[str], keep_alive: bool) -> None:
    assert parse(*lines).keep_alive is keep_alive


@pytest.mark.parametrize(
    ("lines", "expect_continue"),
    [
        (["POST / HTTP/1.1", "Host: gw", "Expect: 100-continue", "Content-Length: 3"], True),
        (["POST / HTTP/1.1", "Host: gw", "Expect: 100-Continue", "Content-Length: 3"], True),
        (["POST / HTTP/1.1", "Host: gw", "Expect: 100-continue", CHUNKED], True),
        (["POST / HTTP/1.1", "Host: gw", "Expect: 100-continue"], False),
        (["POST / HTTP/1.1", "Host: gw", "Expect: 100-continue", "Content-Length: 0"], False),
        (["POST / HTTP/1.0", "Expect: 100-continue", "Content-Length: 3"], False),
        (["POST / HTTP/1.1", "Host: gw", "Expect: 200-ok", "Content-Length: 3"], False),
    ],
)
def test_expect_continue_only_with_a_body_on_http11(
    lines: list[str], expect_continue: bool
) -> None:
    assert parse(*lines).expect_continue is expect_continue


def test_whitespace_after_a_value_is_not_part_of_it() -> None:
    """RFC 9112 section 5: a field value has no leading or trailing whitespace. llhttp strips
    the leading only; what the app gets (an API key, a session id) must not depend on it."""
    parsed = parse("GET / HTTP/1.1", "Host: gw ", "X-A:  spaced \t", "Authorization: Bearer k ")
    assert parsed.headers == [
        (b"host", b"gw"),
        (b"x-a", b"spaced"),
        (b"authorization", b"Bearer k"),
    ]


def test_expect_continue_with_whitespace_after_it() -> None:
    parsed = parse("POST / HTTP/1.1", "Host: gw", "Expect: 100-continue ", "Content-Length: 3")
    assert parsed.expect_continue


def test_an_upgrade_is_noted_for_the_hand_off() -> None:
    parser, parsed = parser_after(
        "GET /v1/ws HTTP/1.1", "Host: gw", "Upgrade: websocket", "Connection: Upgrade"
    )
    assert parsed.upgrade and parser.body_done
    # What follows is the other protocol's, not a body of this request.
    assert parser.body(b"\x81\x05hello") == ([], 0)


def test_an_upgrade_with_a_body_leaves_the_body_to_whom_it_is_handed() -> None:
    parser, parsed = parser_after(
        "POST / HTTP/1.1", "Host: gw", "Upgrade: h2c", "Connection: Upgrade", "Content-Length: 5"
    )
    assert parsed.upgrade and parser.body_done
    assert parser.body(b"hello") == ([], 0)


_TOKENS = st.from_regex(rb"x-[a-z0-9-]{0,15}", fullmatch=True)
_FIELD_VALUES = st.from_regex(rb"[!-~]([ !-~]{0,30}[!-~])?", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_TOKENS, _FIELD_VALUES), max_size=10))
def test_headers_come_back_as_sent(headers: list[tuple[bytes, bytes]]) -> None:
    lines = [b"GET / HTTP/1.1", b"host: gw"] + [name + b": " + value for name, value in headers]
    parsed = RequestParser(max_body_bytes=LIMIT).head(b"\r\n".join(lines) + b"\r\n\r\n")
    assert parsed.headers == [(b"host", b"gw"), *headers]


def test_names_are_lower_cased_and_kept_in_order() -> None:
    parsed = parse("GET / HTTP/1.1", "X-B: 1", "HOST: gw", "x-a: 2", "X-B: 3")
    assert parsed.headers == [(b"x-b", b"1"), (b"host", b"gw"), (b"x-a", b"2"), (b"x-b", b"3")]


# --- refusals ---------------------------------------------------------------------------------

GET = b"GET / HTTP/1.1\r\nHost: gw\r\n"  # a head without its blank line
HOST = "a request needs one Host header (HTTP/1.0: at most one)"
POST = b"POST / HTTP/1.1\r\nHost: gw\r\n"


@pytest.mark.parametrize(
    ("block", "status", "message"),
    [
        (b"GET  / HTTP/1.1\r\nHost: gw\r\n\r\n", 400, "not a request line: b'GET  / HTTP/1.1'"),
        (b"GET /  HTTP/1.1\r\nHost: gw\r\n\r\n", 400, "not a request line: b'GET /  HTTP/1.1'"),
        (b"GET / HTTP/1.1 \r\nHost: gw\r\n\r\n", 400, "not a request line: b'GET / HTTP/1.1 '"),
        (b"GET /\r\nHost: gw\r\n\r\n", 400, "not a request line: b'GET /'"),
        (b"\r\n" + GET + b"\r\n", 400, "a request must begin with its request line"),
        (b"\n" + GET + b"\r\n", 400, "a request must begin with its request line"),
        (b"\r\n\r\n", 400, "a request must begin with its request line"),
        (b"", 400, "a request must begin with its request line"),
        (b"GET / HTTP/1.1\r\n\r\n", 400, HOST),
        (GET + b"Host: gw\r\n\r\n", 400, HOST),
        (GET + b"host: other\r\n\r\n", 400, HOST),
        (b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400, HOST),
        (b" GET / HTTP/1.1\r\nHost: gw\r\n\r\n", 400, "a request must begin with its request line"),
        (
            b"\x00GET / HTTP/1.1\r\nHost: gw\r\n\r\n",
            400,
            "a request must begin with its request line",
        ),
        (b"1GET / HTTP/1.1\r\nHost: gw\r\n\r\n", 400, "a request must begin with its request line"),
        (b"GET / HTTP/2.0\r\nHost: gw\r\n\r\n", 505, "HTTP version 2.0 is not supported"),
        (b"GET / HTTP/0.9\r\n\r\n", 505, "HTTP version 0.9 is not supported"),
        (b"FOO / HTTP/1.1\r\nHost: gw\r\n\r\n", 501, "an unknown method"),
        (
            b"CONNECT gw:443 HTTP/1.1\r\nHost: gw\r\n\r\n",
            400,
            "CONNECT: this server is not a proxy",
        ),
        (
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
            "Transfer-Encoding is not HTTP/1.0",
        ),
        (
            POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n",
            501,
            "only the chunked transfer coding is supported",
        ),
        (
            POST + b"Content-Length: " + b"0" * MAX_LENGTH_DIGITS + b"5\r\n\r\n",
            400,
            f"a Content-Length of more than {MAX_LENGTH_DIGITS} digits",
        ),
        (
            POST + b"Content-Length: 1001\r\n\r\n",
            413,
            "request body of 1001 bytes is larger than the limit (1000 bytes)",
        ),
        (GET, 400, "malformed request: the head did not end at its blank line"),
        (GET + b"\r\n" + GET + b"\r\n", 400, "the request's framing is ambiguous"),
    ],
)
def test_refused_with_our_words(block: bytes, status: int, message: str) -> None:
    error = refusal(block)
    assert (error.status, error.message, str(error)) == (status, message, message)


@pytest.mark.parametrize(
    ("block", "status"),
    [
        (b"GET / HTTP/1.2\r\nHost: gw\r\n\r\n", 505),
        (b"GET / HTTP/3.0\r\n\r\n", 505),
        (b"GET / FTP/1.0\r\n\r\n", 400),
        (b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: gw\r\n\r\n", 400),
        (H2_PREFACE + b"\r\n", 400),
        (GET + b" folded\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost : gw\r\n\r\n", 400),
        (GET + b"no colon\r\n\r\n", 400),
        (GET + b"X: a\x00b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\nHost: gw\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: gw\rX: a\r\n\r\n", 400),
        (POST + b"Content-Length: -1\r\n\r\n", 400),
        (POST + b"Content-Length: +5\r\n\r\n", 400),
        (POST + b"Content-Length: 0x5\r\n\r\n", 400),
        (POST + b"Content-Length: 5, 5\r\n\r\n", 400),
        (POST + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n", 400),
        (POST + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\n", 400),
        (POST + b"Content-Length: " + b"9" * 25 + b"\r\n\r\n", 400),
        (POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (POST + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 400),
        (POST + b"Transfer-Encoding: chunked, chunked\r\n\r\n", 400),
        (POST + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (POST + b"Transfer-Encoding: gzip\r\n\r\n", 400),  # RFC 9112 6.3: not chunked last
        (POST + b"Transfer-Encoding: chunked, gzip\r\n\r\n", 400),  # RFC 9112 6.3
    ],
)
def test_refused_by_llhttp_with_a_status(block: bytes, status: int) -> None:
    assert refusal(block).status == status


def test_the_head_bound_is_exact() -> None:
    start = b"GET / HTTP/1.1\r\nHost: gw\r\nX-F: "
    block = start + b"a" * (MAX_HEAD_BYTES - len(start) - 4) + b"\r\n\r\n"
    assert len(block) == MAX_HEAD_BYTES
    assert RequestParser(max_body_bytes=LIMIT).head(block).headers[-1][0] == b"x-f"
    error = refusal(block[:-4] + b"a\r\n\r\n")
    assert (error.status, error.message) == (
        431,
        f"a request head larger than {MAX_HEAD_BYTES} bytes",
    )


def test_exactly_max_headers_is_allowed_one_more_is_not() -> None:
    lines = ["GET / HTTP/1.1", "Host: gw"] + ["X-H: v"] * (MAX_HEADERS - 1)
    assert len(parse(*lines).headers) == MAX_HEADERS
    error = refusal(head(*lines, "X-H: v"))
    assert (error.status, error.message) == (431, f"more than {MAX_HEADERS} header lines")


def test_a_content_length_of_19_digits_is_a_number_of_20_is_not() -> None:
    nineteen = "0" * (MAX_LENGTH_DIGITS - 1) + "5"
    parsed = parse("POST / HTTP/1.1", "Host: gw", "Content-Length: " + nineteen)
    assert parsed.content_length == 5
    # The largest 19-digit length is a number, and a body larger than the limit.
    error = refusal(head("POST / HTTP/1.1", "Host: gw", "Content-Length: " + "9" * 19))
    assert error.status == 413
    error = refusal(head("POST / HTTP/1.1", "Host: gw", "Content-Length: 0" + nineteen))
    assert (error.status, error.message) == (400, "a Content-Length of more than 19 digits")


def test_a_declared_body_may_reach_the_limit_but_not_pass_it() -> None:
    parser, parsed = parser_after("POST / HTTP/1.1", "Host: gw", f"Content-Length: {LIMIT}")
    assert parsed.content_length == LIMIT
    assert read_body(parser, [b"a" * LIMIT]) == (b"a" * LIMIT, LIMIT, b"")
    error = refusal(head("POST / HTTP/1.1", "Host: gw", f"Content-Length: {LIMIT + 1}"))
    assert error.status == 413


# --- any bytes as a head ----------------------------------------------------------------------

# Valid pieces several times over, so that most heads get past their first line.
_METHODS = st.sampled_from([b"GET", b"POST"] * 4 + [b"HEAD", b"CONNECT", b"PRI", b"FOO", b"get"])
_TARGETS = st.sampled_from([b"/", b"/v1/chat?x=1"] * 3 + [b"*", b"http://gw/", b"", b"/a b"])
_VERSIONS = st.sampled_from([b"HTTP/1.1"] * 6 + [b"HTTP/1.0"] * 3 + [b"HTTP/2.0", b"HTTP/1."])
_NAMES = st.sampled_from(
    [
        *(b"Host", b"X-A", b"X-B", b"Content-Length", b"Transfer-Encoding", b"Connection"),
        *(b"Expect", b"Upgrade", b"", b"Bad Name", b"h\x00"),
    ]
)
_VALUES = st.sampled_from(
    [
        *(b"gw", b"5", b"0", b"-1", b"1" * 25, b"chunked", b"gzip, chunked", b"close"),
        *(b"keep-alive", b"100-continue", b"websocket", b"", b" a ", b"\xff", b"a\rb"),
    ]
)
_ENDS = st.sampled_from([b"\r\n"] * 8 + [b"\n", b"\r", b" \r\n"])


@st.composite
def near_heads(draw: st.DrawFn) -> bytes:
    """Heads built from the pieces of valid and invalid ones, to reach past the request line."""
    line = b" ".join([draw(_METHODS), draw(_TARGETS), draw(_VERSIONS)])
    host = b"Host: gw\r\n" if draw(st.booleans()) else b""
    fields = draw(st.lists(st.tuples(_NAMES, _VALUES, _ENDS), max_size=4))
    return line + b"\r\n" + host + b"".join(n + b": " + v + e for n, v, e in fields) + b"\r\n"


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=300), near_heads()))
def test_any_bytes_as_a_head_parse_or_raise_the_one_error(block: bytes) -> None:
    try:
        parsed = RequestParser(max_body_bytes=LIMIT).head(block)
    except H1Error as exc:
        assert exc.status in (400, 413, 431, 501, 505)
        assert exc.message
    else:
        assert parsed.http_version in ("1.0", "1.1")
        assert all(name == name.lower() for name, _ in parsed.headers)
        assert parsed.framing in ("none", "length", "chunked")
        assert parsed.content_length <= LIMIT


# --- where a head ends ------------------------------------------------------------------------


def test_the_end_of_a_head_is_found_across_reads() -> None:
    buffer = b"GET / HTTP/1.1\r\nHost: gw\r\n"
    assert find_head_end(buffer) is None
    buffer += b"\r\nbody"
    assert find_head_end(buffer, start=len(buffer) - 5) == 28
    assert find_head_end(buffer, start=0) == 28


def test_a_search_resumes_three_bytes_back() -> None:
    """The blank line may have begun in the read before: CR LF CR, then LF."""
    buffer = b"GET / HTTP/1.1\r\nHost: gw\r\n\r"
    assert find_head_end(buffer) is None
    assert find_head_end(buffer + b"\n", start=len(buffer)) == len(buffer) + 1


def test_only_crlf_ends_a_head() -> None:
    assert find_head_end(b"GET / HTTP/1.1\nHost: gw\n\nrest") is None
    assert find_head_end(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\nrest\r\n\r\n") == 28
