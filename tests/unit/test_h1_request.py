"""A client's requests (``http1/request.py``) and where a chunked body ends (``http1/chunks.py``):
what is accepted, what is refused with which status, where a body ends however its bytes are
cut, the bounds exactly at their limit, and that nothing but ``H1Error`` is ever raised.

The messages this side writes are matched word for word; llhttp's refusals by type and status
only (its words are its own, and change between versions)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.http1.chunks import MAX_SIZE_HEX_DIGITS, ChunkFramer
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

LIMIT = 1000  # every parser's max_body_bytes here
CHUNKED = "Transfer-Encoding: chunked"
CRLF = b"\r\n"


def head(*lines: str) -> bytes:
    """A request head: its lines, each ended by CRLF, and the blank line."""
    return "".join(line + "\r\n" for line in lines).encode("latin-1") + b"\r\n"


def parser_after(*lines: str, limit: int = LIMIT) -> tuple[RequestParser, RequestHead]:
    parser = RequestParser(max_body_bytes=limit)
    return parser, parser.head(head(*lines))


def parse(*lines: str) -> RequestHead:
    return parser_after(*lines)[1]


def refusal(block: bytes, limit: int = LIMIT) -> H1Error:
    with pytest.raises(H1Error) as caught:
        RequestParser(max_body_bytes=limit).head(block)
    return caught.value


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


def read_body(parser: RequestParser, reads: list[bytes]) -> tuple[bytes, int, bytes]:
    """As the server reads a body: ``reads`` one after another until the body is done.
    → the body, how many bytes it took, and the bytes after it."""
    body: list[bytes] = []
    used_total = 0
    rest = b""
    for i, data in enumerate(reads):
        if parser.body_done:
            rest = b"".join(reads[i:])
            break
        pieces, used = parser.body(data)
        assert 0 <= used <= len(data)
        assert used == len(data) or parser.body_done
        body += pieces
        used_total += used
        if parser.body_done:
            rest = data[used:] + b"".join(reads[i + 1 :])
            break
    return b"".join(body), used_total, rest


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
            "a request body of 1001 bytes is larger than the limit of 1000",
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


# --- bodies -----------------------------------------------------------------------------------


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
        f"a request body larger than {LIMIT} bytes",
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


# --- the chunked body's framer ----------------------------------------------------------------


def framer(max_line_bytes: int = 1024, max_trailer_bytes: int = 1024) -> ChunkFramer:
    return ChunkFramer(max_line_bytes=max_line_bytes, max_trailer_bytes=max_trailer_bytes)


def framed(f: ChunkFramer, reads: list[bytes]) -> int:
    """How many of the bytes of ``reads`` the framer takes, until it is done."""
    total = 0
    for data in reads:
        used = f.scan(data)
        assert 0 <= used <= len(data)
        assert used == len(data) or f.done
        total += used
        if f.done:
            break
    return total


@settings(max_examples=300)
@given(
    st.lists(st.binary(max_size=300), max_size=12),
    st.lists(st.integers(min_value=0), max_size=20),
    st.sampled_from([b"", b";ext=1", b'; name="v"', b";" + b"e" * 100]),
    st.sampled_from([b"", b"x-checksum: abc\r\n"]),
    st.binary(max_size=20),
)
def test_the_framer_finds_a_body_whole_however_it_is_cut(
    parts: list[bytes], cuts: list[int], extension: bytes, trailer: bytes, after: bytes
) -> None:
    wire = chunked(parts, extension, trailer)
    f = framer()
    assert framed(f, split_at(wire + after, cuts)) == len(wire)
    assert f.done


def test_the_framer_finds_a_body_fed_byte_by_byte() -> None:
    wire = chunked([b"hello", b"\r\n0\r\n\r\n", b"x" * 17], b";a=b", b"T: 1\r\n")
    f = framer()
    used = [f.scan(wire[i : i + 1]) for i in range(len(wire))]
    assert used == [1] * len(wire) and f.done
    assert f.scan(b"GET") == 0 and f.scan(b"") == 0


def test_the_framer_stops_at_the_end_of_the_body() -> None:
    f = framer()
    wire = b"5\r\nhello\r\n0\r\n\r\n"
    assert f.scan(wire + b"0\r\n\r\n") == len(wire) and f.done
    assert f.scan(b"more") == 0


def test_sixteen_hex_digits_are_a_size_seventeen_are_not_even_as_zeros() -> None:
    assert MAX_SIZE_HEX_DIGITS == 16
    f = framer()
    assert f.scan(b"ffffffffffffffff\r\nabc") == 21 and not f.done
    assert framed(framer(), [b"0" * 15 + b"5\r\nhello\r\n0\r\n\r\n"]) == 30
    for size in (b"0" * 16 + b"5", b"1" * 17):
        with pytest.raises(H1Error) as caught:
            framer().scan(size + b"\r\n")
        assert (caught.value.status, caught.value.message) == (
            400,
            f"not a chunk size: {size + CRLF!r}",
        )


@pytest.mark.parametrize("size", [b"+5", b"-5", b"0x5", b"0X5", b"", b" 5", b"5 ", b"5\t", b"g"])
def test_chunk_sizes_are_bare_hex(size: bytes) -> None:
    with pytest.raises(H1Error) as caught:
        framer().scan(size + b"\r\nhello\r\n")
    assert caught.value.message == f"not a chunk size: {size + CRLF!r}"


def test_hex_digits_of_either_case() -> None:
    wire = b"A\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n"
    assert framed(framer(), [wire]) == len(wire)


def test_extensions_after_the_first_semicolon_are_ignored() -> None:
    wire = b"5;a=1;b=2\r\nhello\r\n0;last\r\n\r\n"
    f = framer()
    assert f.scan(wire) == len(wire) and f.done
    with pytest.raises(H1Error, match="not a chunk size"):
        framer().scan(b"5x;a=1\r\n")


def test_a_long_bad_size_line_is_quoted_short() -> None:
    with pytest.raises(H1Error) as caught:
        framer().scan(b"z" * 500 + b"\r\n")
    assert caught.value.message.startswith("not a chunk size: b'zzzz")
    assert len(caught.value.message) < 80


@pytest.mark.parametrize("pieces", [1, 2, 0])
def test_the_size_line_bound_is_exact(pieces: int) -> None:
    """A size line, its extensions and its CRLF, of ``max_line_bytes`` at most: at once, in two
    reads, or a byte at a time (0)."""
    line = b"5;" + b"e" * 28 + b"\r\n"
    assert len(line) == 32

    def reads(data: bytes) -> list[bytes]:
        if pieces == 0:
            return [data[i : i + 1] for i in range(len(data))]
        return split_at(data, [len(data) // 2] if pieces == 2 else [])

    wire = line + b"hello\r\n0\r\n\r\n"
    assert framed(framer(max_line_bytes=32), reads(wire)) == len(wire)
    with pytest.raises(H1Error) as caught:
        framed(framer(max_line_bytes=31), reads(wire))
    assert (caught.value.status, caught.value.message) == (
        400,
        "a chunk-size line longer than 31 bytes",
    )
    # An endless line is refused without its end.
    with pytest.raises(H1Error, match="a chunk-size line longer than 31 bytes"):
        framed(framer(max_line_bytes=31), reads(b"5;" + b"e" * 30))


def test_the_last_size_line_is_bounded_too() -> None:
    line = b"0;" + b"e" * 28 + b"\r\n"
    assert framed(framer(max_line_bytes=32), [line + b"\r\n"]) == 34
    with pytest.raises(H1Error, match="a chunk-size line longer than 31 bytes"):
        framer(max_line_bytes=31).scan(line + b"\r\n")


def test_the_trailer_bound_is_exact() -> None:
    """The trailer section is its field lines and the blank line that ends it."""
    trailers = b"X-Checksum: abc\r\nX-More: 1\r\n\r\n"
    assert len(trailers) == 30
    wire = b"5\r\nhello\r\n0\r\n" + trailers
    f = framer(max_trailer_bytes=30)
    assert f.scan(wire) == len(wire) and f.done
    byte_by_byte = framer(max_trailer_bytes=30)
    assert framed(byte_by_byte, [wire[i : i + 1] for i in range(len(wire))]) == len(wire)
    with pytest.raises(H1Error) as caught:
        framer(max_trailer_bytes=29).scan(wire)
    assert (caught.value.status, caught.value.message) == (431, "trailers larger than 29 bytes")
    with pytest.raises(H1Error, match="trailers larger than 29 bytes"):
        framed(framer(max_trailer_bytes=29), [b"0\r\n", b"X-Endless: " + b"a" * 40])


def test_trailers_end_at_the_blank_line() -> None:
    f = framer()
    assert f.scan(b"0\r\nX-A: 1\r\n") == 11 and not f.done
    assert f.scan(b"X-B: \r\n") == 7 and not f.done  # an empty value is not a blank line
    assert f.scan(b"\r") == 1 and not f.done
    assert f.scan(b"\nNEXT") == 1 and f.done


@settings(max_examples=500)
@given(
    st.lists(st.binary(max_size=60), max_size=8),
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=1, max_value=64),
)
def test_the_framer_takes_any_bytes_with_the_one_error(
    reads: list[bytes], max_line_bytes: int, max_trailer_bytes: int
) -> None:
    f = framer(max_line_bytes, max_trailer_bytes)
    try:
        for data in reads:
            used = f.scan(data)
            assert 0 <= used <= len(data)
            assert used == len(data) or f.done
    except H1Error as exc:
        assert exc.status in (400, 431)
        assert exc.message
