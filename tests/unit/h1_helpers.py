"""Helpers of the HTTP/1.x parser tests (``http1/request.py``, ``http1/chunks.py``,
``http1/response.py``): chunked bodies and cuts across reads for both directions, and request
heads and bodies read as the server reads them."""

from __future__ import annotations

from trio_gateway.http1.request import RequestHead, RequestParser

LIMIT = 1000  # every request parser's max_body_bytes here
CHUNKED = "Transfer-Encoding: chunked"


def head(*lines: str) -> bytes:
    """A request head: its lines, each ended by CRLF, and the blank line."""
    return "".join(line + "\r\n" for line in lines).encode("latin-1") + b"\r\n"


def parser_after(*lines: str, limit: int = LIMIT) -> tuple[RequestParser, RequestHead]:
    parser = RequestParser(max_body_bytes=limit)
    return parser, parser.head(head(*lines))


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
