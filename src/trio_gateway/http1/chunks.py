"""Where a ``Transfer-Encoding: chunked`` request body ends, and the bounds llhttp does not keep.

llhttp checks every byte of a chunked body (``request.py`` feeds them to it), but it parses on
past the body's end into whatever follows, and the server must not let it: the next request on a
connection is read only once this one is answered, and a framing error in it belongs to it, not
to the request before. So the server feeds llhttp exactly the body's bytes, and this framer finds
them: a size line, that many bytes and a CRLF, again, until the size-0 line and the blank line
that ends the trailers. It also refuses what llhttp would take but a strict parser (h11) does
not, and what would let a client hold memory: a size of more than 16 hex digits (llhttp takes any
number of leading zeros), a size line or trailers past their bounds.

What it does not check (the CR before each LF, the CRLF after the data, a trailer's syntax)
llhttp refuses as it reads the same bytes, and the server holds the two to agreeing on where the
body ends (``request.RequestParser``). Pure, no I/O; of what it is fed it keeps a line's first
``_PREFIX_BYTES`` at most.
"""

from __future__ import annotations

import re

from trio_gateway.http1.errors import H1Error

MAX_SIZE_HEX_DIGITS = 16  # a size of up to 2**64 - 1, llhttp's limit on the value
_SIZE = re.compile(rb"[0-9A-Fa-f]{1,%d}" % MAX_SIZE_HEX_DIGITS)
# Of a size line, enough to read a size of 16 digits and the byte after it; of a trailer line,
# enough to see that it is the blank one.
_PREFIX_BYTES = 32


class ChunkFramer:
    """Bytes of a chunked body, as they come → how many of them are the body's (:meth:`scan`).

    ``max_line_bytes`` bounds a size line with its extensions, ``max_trailer_bytes`` the trailer
    section; neither is kept, only counted."""

    def __init__(self, *, max_line_bytes: int, max_trailer_bytes: int) -> None:
        self._max_line_bytes = max_line_bytes
        self._max_trailer_bytes = max_trailer_bytes
        self._state = "size"  # size | data | data_end | trailer | done
        self._prefix = b""  # the current line's first bytes
        self._line_bytes = 0  # the current line's length so far
        self._remaining = 0  # of the chunk's data, or of the CRLF after it
        self._trailer_bytes = 0

    @property
    def done(self) -> bool:
        return self._state == "done"

    def scan(self, data: bytes) -> int:
        """How many of ``data``'s first bytes belong to the body: all of them, until it ends
        (then :attr:`done` is set and what follows is not the body's)."""
        pos = 0
        size = len(data)
        while pos < size:
            state = self._state
            if state == "data" or state == "data_end":
                take = min(self._remaining, size - pos)
                pos += take
                self._remaining -= take
                if not self._remaining:
                    if state == "data":
                        self._state, self._remaining = "data_end", 2  # its CRLF
                    else:
                        self._state = "size"
                continue
            if state == "done":
                break
            end = data.find(b"\n", pos)
            stop = size if end < 0 else end + 1
            self._line_piece(data, pos, stop)
            pos = stop
            if end >= 0:
                self._line_done()
        return pos

    def _line_piece(self, data: bytes, start: int, stop: int) -> None:
        if len(self._prefix) < _PREFIX_BYTES:
            self._prefix += data[start : min(stop, start + _PREFIX_BYTES - len(self._prefix))]
        self._line_bytes += stop - start
        if self._state == "size":
            if self._line_bytes > self._max_line_bytes:
                raise H1Error(f"a chunk-size line longer than {self._max_line_bytes} bytes")
        else:
            self._trailer_bytes += stop - start
            if self._trailer_bytes > self._max_trailer_bytes:
                raise H1Error(f"trailers larger than {self._max_trailer_bytes} bytes", 431)

    def _line_done(self) -> None:
        line, self._prefix, self._line_bytes = self._prefix, b"", 0
        if self._state == "trailer":
            if line in (b"\r\n", b"\n"):
                self._state = "done"
            return
        # The size ends at the extensions (";"), or at the line's end.
        text = line.split(b";", 1)[0].rstrip(b"\n").removesuffix(b"\r")
        if not _SIZE.fullmatch(text):
            raise H1Error(f"not a chunk size: {line[:40]!r}")
        self._remaining = int(text, 16)
        self._state = "data" if self._remaining else "trailer"
