"""The heads of the responses the server writes: pure, no I/O.

The app describes a response (its status and headers); the server decides its framing here: the
app's own ``content-length``, else chunks on HTTP/1.1, else the connection's end, and says
``connection: close`` on every response after which it closes.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Literal

import attrs

_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")

# A response's body may also end with the connection (HTTP/1.0 without a content-length).
ResponseFraming = Literal["none", "length", "chunked", "close"]


@attrs.define(kw_only=True)
class SentHead:
    data: bytes  # the head as written, blank line included (b"" once written: not kept)
    framing: ResponseFraming
    content_length: int  # with framing "length"
    close: bool  # the connection ends with this response


def encode_response_head(
    status: int,
    headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
    *,
    http_version: str,
    keep_alive: bool,
    date: bytes,
    head_request: bool = False,
) -> SentHead:
    """The head of a response the app describes (its status and headers), with the framing its
    body needs: its own ``content-length``, else chunks on HTTP/1.1, else the connection's end.
    Raises ValueError for a header no client should get (an app bug, never a client's)."""
    if not 200 <= status <= 599:
        raise ValueError(f"status {status} is not a final status")
    length: int | None = None
    close = not keep_alive
    out = [b"HTTP/1.1 %d %s\r\n" % (status, _reason(status))]
    has_date = False
    for name, value in headers:
        name = bytes(name).lower()
        value = bytes(value)
        if not _TOKEN.fullmatch(name) or b"\r" in value or b"\n" in value or b"\0" in value:
            raise ValueError(f"invalid response header {name[:40]!r}")
        if name == b"content-length":
            if not value.isdigit():
                raise ValueError(f"not a content-length: {value[:20]!r}")
            length = int(value)
            continue  # written below, once, where the framing is decided
        elif name == b"transfer-encoding":
            continue  # the framing is the server's to choose
        elif name == b"connection":
            close = close or b"close" in value.lower()
            continue
        elif name == b"date":
            has_date = True
        out.append(name + b": " + value + b"\r\n")
    if not has_date:
        out.append(b"date: " + date + b"\r\n")
    bodiless = status in (204, 304) or head_request
    framing: ResponseFraming
    if bodiless:
        framing = "none"
        if length is not None and status != 204:
            out.append(b"content-length: %d\r\n" % length)
        length = 0
    elif length is not None:
        framing = "length"
        out.append(b"content-length: %d\r\n" % length)
    elif http_version == "1.1":
        framing = "chunked"
        out.append(b"transfer-encoding: chunked\r\n")
    else:
        framing = "close"
        close = True
    if close:
        out.append(b"connection: close\r\n")
    elif http_version == "1.0":
        out.append(b"connection: keep-alive\r\n")
    out.append(b"\r\n")
    return SentHead(data=b"".join(out), framing=framing, content_length=length or 0, close=close)


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def error_response(status: int, body: bytes, *, date: bytes) -> bytes:
    """A whole response of the server's own (the connection closes after it)."""
    head = encode_response_head(
        status,
        [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        http_version="1.1",
        keep_alive=False,
        date=date,
    )
    return head.data + body
