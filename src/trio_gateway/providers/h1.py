"""HTTP/1.1 responses parsed by hand, for the streaming path: pure, bounded, no I/O.

Reading an upstream's token stream through httpx costs about twice a raw socket read per chunk
(httpx → httpcore → h11, each with its own per-read machinery; docs/benchmarks.md). The stream
needs little of HTTP: a status line, headers, and a body framed by ``Transfer-Encoding:
chunked``, ``Content-Length`` or the connection's end. These classes take bytes as they come off
the socket and give back the head and the body's bytes, keeping at most one bounded line of
their own (a response head, a chunk-size line, a trailer).
"""

from __future__ import annotations

import attrs

from trio_gateway.chunked import MAX_LINE_BYTES, ChunkedBody, H1Error

__all__ = ["MAX_LINE_BYTES", "ChunkedBody", "H1Error", "HeadReader", "LengthBody", "parse_head"]

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 256


@attrs.frozen(kw_only=True)
class ResponseHead:
    status: int
    reason: str
    http10: bool
    headers: tuple[tuple[str, str], ...]  # names lower-cased, in the order received

    def get(self, name: str) -> str | None:
        """The last value of ``name`` (lower case), or None."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in (self.get("connection") or "").split(",")}
        return "keep-alive" in tokens if self.http10 else "close" not in tokens


def parse_head(block: bytes) -> ResponseHead:
    """One response head: the status line and the header lines, without the blank line."""
    lines = block.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise H1Error(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    if len(code) != 3 or not code.isdigit():
        raise H1Error(f"not a status code: {code[:20]!r}")
    if len(lines) - 1 > MAX_HEADERS:
        raise H1Error(f"more than {MAX_HEADERS} header lines")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name:
            raise H1Error(f"not a header line: {line[:80]!r}")
        headers.append((name.decode("latin-1").lower(), value.strip().decode("latin-1")))
    return ResponseHead(
        status=int(code),
        reason=reason.decode("latin-1"),
        http10=version == b"HTTP/1.0",
        headers=tuple(headers),
    )


class HeadReader:
    """Bytes → the final response head (1xx informational heads are skipped) and what followed
    it. Keeps at most ``MAX_HEAD_BYTES``."""

    def __init__(self) -> None:
        self._buffer = b""
        self.leftover = b""

    def feed(self, data: bytes) -> ResponseHead | None:
        self._buffer += data
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    raise H1Error(f"a response head larger than {MAX_HEAD_BYTES} bytes")
                return None
            if end > MAX_HEAD_BYTES:
                raise H1Error(f"a response head larger than {MAX_HEAD_BYTES} bytes")
            head = parse_head(self._buffer[:end])
            rest = self._buffer[end + 4 :]
            if 100 <= head.status < 200 and head.status != 101:
                self._buffer = rest
                continue  # 100 Continue, 103 Early Hints: the real head follows
            self.leftover = rest  # a reader gives one head: its buffer is not read again
            return head


class LengthBody:
    """A ``Content-Length`` body."""

    def __init__(self, length: int) -> None:
        self._remaining = length
        self.leftover = b""

    @property
    def done(self) -> bool:
        return not self._remaining

    def feed(self, data: bytes) -> list[bytes]:
        take = min(self._remaining, len(data))
        self._remaining -= take
        self.leftover += data[take:]
        return [data[:take]] if take else []


def body_reader(
    head: ResponseHead, *, head_request: bool = False
) -> ChunkedBody | LengthBody | None:
    """How ``head``'s body is framed; None: it ends when the connection does. The answer to a
    HEAD request has none, whatever its head says."""
    if head.status in (204, 304) or 100 <= head.status < 200 or head_request:
        return LengthBody(0)
    encoding = head.get("transfer-encoding")
    if encoding is not None:
        if encoding.lower().rpartition(",")[2].strip() != "chunked":  # the last coding
            raise H1Error(f"a transfer-encoding other than chunked: {encoding!r}")
        return ChunkedBody()
    length = head.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise H1Error(f"not a content-length: {length!r}")
        return LengthBody(int(length))
    return None
