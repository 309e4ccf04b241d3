"""HTTP/1.1 responses parsed by hand, for the streaming path: pure, bounded, no I/O.

Reading an upstream's token stream through httpx costs about twice a raw socket read per chunk
(httpx → httpcore → h11, each with its own per-read machinery; docs/benchmarks.md). The stream
needs little of HTTP: a status line, headers, and a body framed by ``Transfer-Encoding:
chunked``, ``Content-Length`` or the connection's end. These classes take bytes as they come off
the socket and give back the head and the body's bytes, keeping at most one bounded line of
their own (a response head, a chunk-size line, a trailer).
"""

from __future__ import annotations

from trio_gateway.chunked import MAX_LINE_BYTES, ChunkedBody, H1Error

__all__ = ["MAX_LINE_BYTES", "ChunkedBody", "H1Error", "HeadReader", "LengthBody", "parse_head"]

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 256


class ResponseHead:
    """A status line and its headers. Made by :func:`parse_head`, it keeps the header lines as
    they came (one ``bytes``) and finds a header when asked: a stream holds its head as long as
    it runs, and a tuple of name and value strings was some 0.6 KiB of each of thousands."""

    __slots__ = ("_block", "_headers", "http10", "reason", "status")

    def __init__(
        self,
        *,
        status: int,
        reason: str,
        http10: bool,
        headers: tuple[tuple[str, str], ...] = (),
        block: bytes = b"",
    ) -> None:
        self.status = status
        self.reason = reason
        self.http10 = http10
        self._headers = headers
        # The header lines, each after its "\r\n" (checked by parse_head), or b"".
        self._block = block

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """Names lower-cased, in the order received."""
        if not self._block:
            return self._headers
        return tuple(_header(line) for line in self._block.split(b"\r\n")[1:])

    def get(self, name: str) -> str | None:
        """The last value of ``name`` (lower case), or None."""
        if not self._block:
            found = None
            for key, value in self._headers:
                if key == name:
                    found = value
            return found
        block = self._block
        lowered = block.lower()  # same offsets: latin-1 bytes
        needle = b"\r\n" + name.encode("latin-1") + b":"
        found_at = -1
        at = lowered.find(needle)
        while at >= 0:
            found_at = at + len(needle)
            at = lowered.find(needle, found_at)
        if found_at < 0:
            return None
        end = block.find(b"\r\n", found_at)
        return block[found_at : end if end >= 0 else len(block)].strip().decode("latin-1")

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in (self.get("connection") or "").split(",")}
        return "keep-alive" in tokens if self.http10 else "close" not in tokens


def _header(line: bytes) -> tuple[str, str]:
    name, _, value = line.partition(b":")
    return name.decode("latin-1").lower(), value.strip().decode("latin-1")


def parse_head(block: bytes) -> ResponseHead:
    """One response head: the status line and the header lines, without the blank line."""
    status_end = block.find(b"\r\n")
    status_line = block if status_end < 0 else block[:status_end]
    version, _, rest = status_line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise H1Error(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    if len(code) != 3 or not code.isdigit():
        raise H1Error(f"not a status code: {code[:20]!r}")
    lines = block[status_end:].split(b"\r\n")[1:] if status_end >= 0 else []
    if len(lines) > MAX_HEADERS:
        raise H1Error(f"more than {MAX_HEADERS} header lines")
    for line in lines:
        name, sep, _ = line.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name:
            raise H1Error(f"not a header line: {line[:80]!r}")
    return ResponseHead(
        status=int(code),
        reason=reason.decode("latin-1"),
        http10=version == b"HTTP/1.0",
        block=block[status_end:] if lines else b"",
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
