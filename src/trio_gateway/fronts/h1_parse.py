"""HTTP/1.1 requests parsed, and response heads written, by hand: pure, bounded, no I/O.

The server side of the gateway's own HTTP/1.x front (``h1_serve.py``). Strict where laxness is a
risk (RFC 9112): a request with both ``Transfer-Encoding`` and ``Content-Length``, an unknown
transfer coding, a ``Content-Length`` that is not one number, a header line folded or with
space before its colon, a missing or doubled ``Host`` on HTTP/1.1 are refused, not guessed at;
what a proxy in front could read differently is never let through. Lenient where it costs
nothing: a bare LF ends a line as CRLF does.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Literal

import attrs

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 256
# The blank line that ends a head: CRLF CRLF, or bare LFs (RFC 9112 section 2.2 lets a recipient
# take LF for CRLF).
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
# A field value: visible characters, spaces and tabs, and obs-text (bytes past 0x7f).
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_VERSION = re.compile(rb"HTTP/\d\.\d")
# HTTP/2 with prior knowledge opens with "PRI * HTTP/2.0", a blank line, "SM" and another.
H2_PREFACE_LINE = b"PRI * HTTP/2.0"

Framing = Literal["none", "length", "chunked"]
# A response's body may also end with the connection (HTTP/1.0 without a content-length).
ResponseFraming = Literal["none", "length", "chunked", "close"]


class RequestHeadError(Exception):
    """A request the server answers itself, with ``status``, and then closes the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@attrs.frozen(kw_only=True)
class RequestHead:
    method: str
    target: bytes
    http_version: str  # "1.1" or "1.0", as ASGI's scope has it
    headers: list[tuple[bytes, bytes]]  # names lower-cased, in the order received
    framing: Framing
    content_length: int  # with framing "length"
    keep_alive: bool  # what the request asks; the response may still close
    expect_continue: bool
    upgrade: bool  # Upgrade (WebSocket, h2c): not this server's to answer


def find_head_end(buffer: bytes | bytearray, start: int = 0) -> tuple[int, int] | None:
    """(end of the head, start of what follows) once ``buffer`` holds a whole head."""
    match = _HEAD_END.search(buffer, max(0, start - 3))
    return None if match is None else (match.start(), match.end())


def parse_request_head(block: bytes) -> RequestHead:
    """One request head: the request line and the header lines, without the blank line."""
    lines = block.split(b"\n")
    request_line = lines[0].removesuffix(b"\r")
    parts = request_line.split(b" ")
    if len(parts) != 3:
        raise RequestHeadError(400, f"not a request line: {request_line[:80]!r}")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise RequestHeadError(400, f"not a method: {method[:40]!r}")
    if not _TARGET.fullmatch(target):
        raise RequestHeadError(400, "a request target must be visible ASCII")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        if _VERSION.fullmatch(version):
            raise RequestHeadError(505, f"HTTP version {version.decode()} is not supported")
        raise RequestHeadError(400, f"not an HTTP version: {version[:20]!r}")
    if len(lines) - 1 > MAX_HEADERS:
        raise RequestHeadError(431, f"more than {MAX_HEADERS} header lines")
    headers: list[tuple[bytes, bytes]] = []
    for raw in lines[1:]:
        line = raw.removesuffix(b"\r")
        if line[:1] in (b" ", b"\t"):
            raise RequestHeadError(400, "a folded header line (obs-fold) is not accepted")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise RequestHeadError(400, f"not a header line: {line[:80]!r}")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise RequestHeadError(400, f"a control character in header {name.decode()!r}")
        headers.append((name.lower(), value))
    return _head(method.decode(), target, version, headers)


def _head(
    method: str, target: bytes, version: bytes, headers: list[tuple[bytes, bytes]]
) -> RequestHead:
    http11 = version == b"HTTP/1.1"
    hosts = 0
    lengths: list[bytes] = []
    codings: list[bytes] = []
    connection: set[bytes] = set()
    expect = b""
    upgrade = False
    for name, value in headers:
        if name == b"host":
            hosts += 1
        elif name == b"content-length":
            lengths += [v.strip(b" \t") for v in value.split(b",")]
        elif name == b"transfer-encoding":
            codings += [v.strip(b" \t").lower() for v in value.split(b",") if v.strip(b" \t")]
        elif name == b"connection":
            connection |= {v.strip(b" \t").lower() for v in value.split(b",")}
        elif name == b"expect":
            expect = value.lower()
        elif name == b"upgrade":
            upgrade = True
    if http11 and hosts != 1:
        raise RequestHeadError(400, "an HTTP/1.1 request needs exactly one Host header")
    framing: Framing = "none"
    length = 0
    if codings:
        if not http11:
            raise RequestHeadError(400, "Transfer-Encoding is not HTTP/1.0")
        if lengths:
            raise RequestHeadError(400, "Transfer-Encoding and Content-Length together")
        if codings != [b"chunked"]:
            raise RequestHeadError(501, "only the chunked transfer coding is supported")
        framing = "chunked"
    elif lengths:
        if any(not v.isdigit() for v in lengths) or len(set(lengths)) != 1:
            raise RequestHeadError(400, "Content-Length is not one number")
        length = int(lengths[0])
        framing = "length" if length else "none"
    keep_alive = b"close" not in connection if http11 else b"keep-alive" in connection
    return RequestHead(
        method=method,
        target=target,
        http_version="1.1" if http11 else "1.0",
        headers=headers,
        framing=framing,
        content_length=length,
        keep_alive=keep_alive,
        expect_continue=http11 and expect == b"100-continue" and framing != "none",
        upgrade=upgrade,
    )


@attrs.define(kw_only=True)
class ResponseHead:
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
) -> ResponseHead:
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
    return ResponseHead(
        data=b"".join(out), framing=framing, content_length=length or 0, close=close
    )


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
