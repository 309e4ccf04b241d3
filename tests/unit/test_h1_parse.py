"""The HTTP/1.x front's request parser and response heads: what is accepted, what is refused
with which status, and that nothing else is ever raised, whatever the bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.fronts.h1_parse import (
    MAX_HEADERS,
    RequestHeadError,
    encode_response_head,
    find_head_end,
    parse_request_head,
)

DATE = b"Tue, 01 Dec 2026 20:00:00 GMT"


def head(*lines: str) -> bytes:
    return "\r\n".join(lines).encode("latin-1")


def test_a_post_with_a_length() -> None:
    parsed = parse_request_head(
        head("POST /v1/chat/completions?x=1 HTTP/1.1", "Host: gw", "Content-Length: 12")
    )
    assert parsed.method == "POST" and parsed.target == b"/v1/chat/completions?x=1"
    assert parsed.http_version == "1.1"
    assert parsed.headers == [(b"host", b"gw"), (b"content-length", b"12")]
    assert (parsed.framing, parsed.content_length) == ("length", 12)
    assert parsed.keep_alive and not parsed.expect_continue and not parsed.upgrade


@pytest.mark.parametrize(
    ("lines", "framing", "length"),
    [
        (["GET / HTTP/1.1", "Host: gw"], "none", 0),
        (["POST / HTTP/1.1", "Host: gw", "Content-Length: 0"], "none", 0),
        (["POST / HTTP/1.1", "Host: gw", "Content-Length: 5, 5"], "length", 5),
        (["POST / HTTP/1.1", "Host: gw", "Content-Length: 5", "Content-Length: 5"], "length", 5),
        (["POST / HTTP/1.1", "Host: gw", "Transfer-Encoding: chunked"], "chunked", 0),
        (["POST / HTTP/1.1", "Host: gw", "Transfer-Encoding: Chunked"], "chunked", 0),
    ],
)
def test_body_framing(lines: list[str], framing: str, length: int) -> None:
    parsed = parse_request_head(head(*lines))
    assert (parsed.framing, parsed.content_length) == (framing, length)


@pytest.mark.parametrize(
    ("lines", "keep_alive"),
    [
        (["GET / HTTP/1.1", "Host: gw"], True),
        (["GET / HTTP/1.1", "Host: gw", "Connection: close"], False),
        (["GET / HTTP/1.1", "Host: gw", "Connection: keep-alive, Close"], False),
        (["GET / HTTP/1.0"], False),
        (["GET / HTTP/1.0", "Connection: Keep-Alive"], True),
    ],
)
def test_keep_alive(lines: list[str], keep_alive: bool) -> None:
    assert parse_request_head(head(*lines)).keep_alive is keep_alive


def test_expect_continue_only_with_a_body_on_http11() -> None:
    with_body = head("POST / HTTP/1.1", "Host: gw", "Expect: 100-continue", "Content-Length: 3")
    assert parse_request_head(with_body).expect_continue
    without = head("POST / HTTP/1.1", "Host: gw", "Expect: 100-continue")
    assert not parse_request_head(without).expect_continue


def test_an_upgrade_is_noted_for_the_hand_off() -> None:
    upgrade = head("GET /v1/ws HTTP/1.1", "Host: gw", "Upgrade: websocket", "Connection: Upgrade")
    assert parse_request_head(upgrade).upgrade


def test_bare_lf_line_ends_are_taken() -> None:
    parsed = parse_request_head(b"GET / HTTP/1.1\nHost: gw\nX-A:  spaced \t")
    assert parsed.headers == [(b"host", b"gw"), (b"x-a", b"spaced")]


@pytest.mark.parametrize(
    ("block", "status"),
    [
        (b"GET /", 400),
        (b"GET  / HTTP/1.1\r\nHost: gw", 400),
        (b"G(T / HTTP/1.1\r\nHost: gw", 400),
        (b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: gw", 400),
        (b"GET / HTTP/2.0\r\nHost: gw", 505),
        (b"GET / HTTP/3.0", 505),
        (b"GET / FTP/1.0", 400),
        (b"GET / HTTP/1.1", 400),  # no Host
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b", 400),
        (b"GET / HTTP/1.1\r\nHost: gw\r\n folded", 400),
        (b"GET / HTTP/1.1\r\nHost : gw", 400),
        (b"GET / HTTP/1.1\r\nHost: gw\r\nno colon", 400),
        (b"GET / HTTP/1.1\r\nHost: gw\r\nX: a\x00b", 400),
        (b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: -1", 400),
        (b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: +5", 400),
        (b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 5, 6", 400),
        (b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nContent-Length: 6", 400),
        (b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer-Encoding: chunked", 400),
        (b"POST / HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip, chunked", 501),
        (b"POST / HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked, chunked", 501),
        (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked", 400),
        (b"GET / HTTP/1.1\r\nHost: gw" + b"\r\nX: y" * MAX_HEADERS, 431),
    ],
)
def test_refused_with_a_status(block: bytes, status: int) -> None:
    with pytest.raises(RequestHeadError) as caught:
        parse_request_head(block)
    assert caught.value.status == status
    assert caught.value.message


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_the_one_error(data: bytes) -> None:
    try:
        parsed = parse_request_head(data)
    except RequestHeadError as exc:
        assert exc.status in (400, 431, 501, 505)
    else:
        assert all(name == name.lower() for name, _ in parsed.headers)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.from_regex(rb"[a-z][a-z0-9-]{0,15}", fullmatch=True),
            st.from_regex(rb"[!-~]([ !-~]{0,30}[!-~])?", fullmatch=True),
        ),
        max_size=10,
    )
)
def test_headers_come_back_as_sent(headers: list[tuple[bytes, bytes]]) -> None:
    lines = [b"GET / HTTP/1.1", b"host: gw"] + [name + b": " + value for name, value in headers]
    parsed = parse_request_head(b"\r\n".join(lines))
    assert parsed.headers == [(b"host", b"gw"), *headers]


def test_the_end_of_a_head_is_found_across_reads() -> None:
    buffer = b"GET / HTTP/1.1\r\nHost: gw\r\n"
    assert find_head_end(buffer) is None
    buffer += b"\r\nbody"
    assert find_head_end(buffer, start=len(buffer) - 5) == (24, 28)
    assert find_head_end(b"GET / HTTP/1.1\nHost: gw\n\nrest") == (23, 25)


# --- response heads ---------------------------------------------------------------------------


def test_a_sized_answer_keeps_its_length_and_gets_a_date() -> None:
    out = encode_response_head(
        200,
        [(b"Content-Type", b"application/json"), (b"content-length", b"7")],
        http_version="1.1",
        keep_alive=True,
        date=DATE,
    )
    assert out.data == (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ndate: " + DATE + b"\r\n"
        b"content-length: 7\r\n\r\n"
    )
    assert (out.framing, out.content_length, out.close) == ("length", 7, False)


def test_an_unsized_answer_is_chunked_on_http11_and_closes_on_http10() -> None:
    chunked = encode_response_head(200, [], http_version="1.1", keep_alive=True, date=DATE)
    assert b"transfer-encoding: chunked\r\n" in chunked.data and chunked.framing == "chunked"
    assert not chunked.close
    closing = encode_response_head(200, [], http_version="1.0", keep_alive=True, date=DATE)
    assert closing.framing == "close" and closing.close
    assert b"connection: close\r\n" in closing.data


def test_keep_alive_and_close_are_the_server_s_to_say() -> None:
    kept = encode_response_head(
        200, [(b"content-length", b"0")], http_version="1.0", keep_alive=True, date=DATE
    )
    assert b"connection: keep-alive\r\n" in kept.data and not kept.close
    app_closes = encode_response_head(
        200,
        [(b"content-length", b"0"), (b"connection", b"close"), (b"transfer-encoding", b"x")],
        http_version="1.1",
        keep_alive=True,
        date=DATE,
    )
    assert app_closes.close and app_closes.data.count(b"connection: close") == 1
    assert b"transfer-encoding" not in app_closes.data


def test_bodiless_answers() -> None:
    no_content = encode_response_head(204, [], http_version="1.1", keep_alive=True, date=DATE)
    assert no_content.framing == "none" and b"content-length" not in no_content.data
    head_request = encode_response_head(
        405,
        [(b"content-length", b"99")],
        http_version="1.1",
        keep_alive=True,
        date=DATE,
        head_request=True,
    )
    assert head_request.framing == "none" and b"content-length: 99\r\n" in head_request.data


@pytest.mark.parametrize(
    ("status", "headers"),
    [
        (100, []),
        (700, []),
        (200, [(b"x-bad", b"a\r\nb")]),
        (200, [(b"bad name", b"v")]),
    ],
)
def test_an_app_s_bad_head_is_an_error_not_a_wire_injection(
    status: int, headers: list[tuple[bytes, bytes]]
) -> None:
    with pytest.raises(ValueError):
        encode_response_head(status, headers, http_version="1.1", keep_alive=True, date=DATE)
