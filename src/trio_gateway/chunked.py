"""A ``Transfer-Encoding: chunked`` body decoded from bytes: pure, bounded, no I/O.

Both sides of the gateway read chunked bodies: the upstream's streamed answers
(``providers/h1.py``) and a client's request body (``fronts/h1_serve.py``).
"""

from __future__ import annotations

MAX_LINE_BYTES = 4 * 1024  # a chunk-size line with its extensions, or one trailer line


class H1Error(Exception):
    """The peer does not speak HTTP/1.1 as it must; the message says where."""


class ChunkedBody:
    """A ``Transfer-Encoding: chunked`` body → its bytes, as slices of what was fed (no copy of
    chunk data). Keeps at most one unfinished size or trailer line."""

    # Data bytes left in the current chunk: set by each size line, before any data is read.
    _remaining: int

    def __init__(self) -> None:
        self._line = b""  # an unfinished size, CRLF or trailer line
        self._state = "size"  # size | data | data_end | trailer | done
        self.leftover = b""  # what came after the body (a server that pipelines: nothing)

    @property
    def done(self) -> bool:
        return self._state == "done"

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        pos = 0
        size = len(data)
        while pos < size:
            state = self._state
            if state == "data":
                take = min(self._remaining, size - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = "data_end"
                continue
            if state == "done":
                self.leftover += data[pos:]
                break
            end = data.find(b"\n", pos)
            if end < 0:
                self._line += data[pos:]
                if len(self._line) > MAX_LINE_BYTES:
                    raise H1Error(f"a chunk line longer than {MAX_LINE_BYTES} bytes")
                break
            line = self._line + data[pos:end]
            self._line = b""
            pos = end + 1
            if len(line) > MAX_LINE_BYTES:
                raise H1Error(f"a chunk line longer than {MAX_LINE_BYTES} bytes")
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line_done(line)
        return out

    def _line_done(self, line: bytes) -> None:
        if self._state == "data_end":
            if line:
                raise H1Error(f"chunk data longer than its size: {line[:40]!r}")
            self._state = "size"
        elif self._state == "size":
            text = line.partition(b";")[0].strip()  # a size, then maybe ;extensions
            try:
                if not text or text.startswith((b"+", b"-", b"0x", b"0X")):
                    raise ValueError
                self._remaining = int(text, 16)
            except ValueError:
                raise H1Error(f"not a chunk size: {line[:40]!r}") from None
            self._state = "data" if self._remaining else "trailer"
        elif self._state == "trailer" and not line:
            self._state = "done"  # a blank line ends the body; trailer fields are ignored
