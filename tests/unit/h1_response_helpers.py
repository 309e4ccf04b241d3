"""Helpers of the response parser tests (``http1/response.py``): responses written out, and
read as the client reads them, its head and body after every read."""

from __future__ import annotations

import pytest

from trio_gateway.http1.errors import H1Error
from trio_gateway.http1.response import ResponseHead, ResponseParser

READ_BYTES = 16 * 1024  # what the client reads at a time


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
