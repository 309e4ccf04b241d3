"""The heads of the responses the server writes (``http1/heads.py``): the framing each body gets,
who says ``connection: close``, and that an app's bad head is an error, never bytes on the wire."""

from __future__ import annotations

import pytest

from trio_gateway.http1.heads import encode_response_head, error_response

DATE = b"Tue, 01 Dec 2026 20:00:00 GMT"


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
    sized = encode_response_head(
        204, [(b"content-length", b"5")], http_version="1.1", keep_alive=True, date=DATE
    )
    assert sized.framing == "none" and b"content-length" not in sized.data
    assert sized.content_length == 0
    not_modified = encode_response_head(
        304, [(b"content-length", b"5")], http_version="1.1", keep_alive=True, date=DATE
    )
    assert not_modified.framing == "none" and b"content-length: 5\r\n" in not_modified.data
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


def test_an_app_s_own_date_is_kept() -> None:
    out = encode_response_head(
        200,
        [(b"Date", b"then"), (b"content-length", b"0")],
        http_version="1.1",
        keep_alive=True,
        date=DATE,
    )
    assert out.data.count(b"date: ") == 1 and b"date: then\r\n" in out.data


def test_an_error_response_is_whole_and_closes() -> None:
    body = b'{"error": {"code": "malformed_http"}}'
    out = error_response(400, body, date=DATE)
    assert out == (
        b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ndate: " + DATE + b"\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body
    )
