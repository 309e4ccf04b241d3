"""An upstream's response parsed by llhttp (httptools) in its strict mode: pure, bounded, no I/O.

The streaming path reads a response as it comes off the socket: the head, then the body's bytes
read by read (``client.py``). llhttp frames it (``Content-Length``, chunks, or the connection's
end) and refuses what a strict parser must: ``Transfer-Encoding`` with ``Content-Length``, two
``Content-Length``s, a length or chunk size that is not plain digits, bare CR or LF. What this
module adds:

- bounds: a head of ``MAX_HEAD_BYTES`` and ``MAX_HEADERS`` lines, and no more than that many
  bytes in a row that are not body (a chunk-size line, trailers);
- a transfer coding other than ``chunked``, a version other than 1.0 and 1.1, a 101: refused;
- a ``Content-Encoding`` is decoded (gzip, deflate) or refused, never passed on as its bytes;
- bytes after the response (a server that talks out of turn) are noticed: that connection is
  never used again.

One ``ResponseParser`` per response; every refusal is an
:class:`~trio_gateway.http1.errors.H1Error`.
"""

from __future__ import annotations

import zlib

import httptools

from trio_gateway.http1.callbacks import Forward
from trio_gateway.http1.errors import H1Error

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 256
# What one read may decode to: a compressed body that grows more than this from one read (16
# KiB) is a bomb, not an answer.
MAX_DECODED_BYTES_PER_READ = 4 * 1024 * 1024
_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class ResponseHead:
    """A status line and its headers. It keeps the header lines as one ``bytes`` and finds a
    header when asked: a stream holds its head as long as it runs, and a tuple of name and value
    strings was some 0.6 KiB of each of thousands."""

    __slots__ = ("_block", "http10", "reason", "status")

    def __init__(self, *, status: int, reason: str, http10: bool, block: bytes = b"") -> None:
        self.status = status
        self.reason = reason
        self.http10 = http10
        # Each header as "\r\n" name ":" value; names as received (``get`` is case-blind).
        self._block = block

    @classmethod
    def from_headers(
        cls, status: int, reason: str, http10: bool, headers: list[tuple[bytes, bytes]]
    ) -> ResponseHead:
        block = b"".join(b"\r\n" + name + b":" + value for name, value in headers)
        return cls(status=status, reason=reason, http10=http10, block=block)

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """Names lower-cased, in the order received."""
        return tuple(_header(line) for line in self._block.split(b"\r\n")[1:])

    def get(self, name: str) -> str | None:
        """The last value of ``name`` (lower case), or None."""
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


def _codings(headers: list[tuple[bytes, bytes]], name: bytes) -> list[str]:
    """The codings a header lists, over all its lines, lower-cased (empty items dropped)."""
    out: list[str] = []
    for key, value in headers:
        if key.lower() == name:
            out += [c.strip(" \t").lower() for c in value.decode("latin-1").split(",")]
    return [c for c in out if c]


def _header(line: bytes) -> tuple[str, str]:
    name, _, value = line.partition(b":")
    return name.decode("latin-1").lower(), value.strip().decode("latin-1")


class ResponseParser:
    """Bytes from the upstream → the final head (:meth:`feed` until it gives one: 1xx heads are
    skipped), then the body's bytes (:meth:`feed` again, until :attr:`done`)."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(_FORWARD)
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head: ResponseHead | None = None
        self._pieces: list[bytes] = []
        # Bytes fed since the last sign of progress (the head's end, body bytes): bounds what
        # llhttp and httptools keep of an unfinished head, size line or trailer.
        self._quiet = 0
        self._decoder: zlib._Decompress | None = None
        self._wbits = 0
        self.until_close = False  # the body ends with the connection
        self.done = False
        self.extra = False  # bytes came after the response: the connection is not reusable

    # --- llhttp's callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.done:
            self.extra = True
            raise _Stop

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head is not None:
            return  # a trailer: bounded by the quiet count, not kept
        if len(self._headers) >= MAX_HEADERS:
            raise H1Error(f"more than {MAX_HEADERS} header lines")
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        # Counted with the whole read that ends the head: bounded, if not exact.
        if self._quiet > MAX_HEAD_BYTES:
            raise H1Error(f"a response head larger than {MAX_HEAD_BYTES} bytes")
        self._quiet = 0
        parser = self._parser
        status = parser.get_status_code()
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise H1Error(f"not an HTTP/1.x response: HTTP/{version}")
        headers, self._headers = self._headers, []
        reason, self._reason = self._reason, b""
        if 100 <= status < 200:
            if status == 101:
                raise H1Error("101 Switching Protocols, to a request that asked for no upgrade")
            return  # 100 Continue, 103 Early Hints: the real head follows
        head = ResponseHead.from_headers(
            status, reason.decode("latin-1"), version == "1.0", headers
        )
        codings = _codings(headers, b"transfer-encoding")
        if codings and codings != ["chunked"]:
            raise H1Error(f"a transfer-encoding other than chunked: {', '.join(codings)!r}")
        bodiless = status in (204, 304)
        encodings = [c for c in _codings(headers, b"content-encoding") if c != "identity"]
        if encodings and not bodiless:
            # One coding is decoded; codings applied one over another never come from a server
            # that was not asked for any (requests say identity).
            wbits = _DECODERS.get(encodings[0])
            if len(encodings) > 1 or wbits is None:
                raise H1Error(
                    f"a content-encoding that cannot be decoded: {', '.join(encodings)!r}"
                )
            self._wbits = wbits
            self._decoder = zlib.decompressobj(wbits)
        self.until_close = not bodiless and not codings and head.get("content-length") is None
        self._head = head

    def on_body(self, body: bytes) -> None:
        self._quiet = 0
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        self._quiet = 0
        if self._head is not None:
            self.done = True

    # --- feeding ------------------------------------------------------------------------------

    def feed(self, data: bytes) -> ResponseHead | None:
        """Parse ``data``; the head, once there is one (the same head again on later calls)."""
        if self.done:
            self.extra = self.extra or bool(data)
            return self._head
        self._quiet += len(data)
        _FORWARD.current = self
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, H1Error):
                raise cause from None
            if not isinstance(cause, _Stop):
                raise H1Error(f"malformed response: {exc}") from None
        except httptools.HttpParserUpgrade:
            raise H1Error("a response that switches protocols") from None
        except httptools.HttpParserError as exc:
            if not self.done:
                raise H1Error(f"malformed response: {exc}") from None
            # llhttp refuses what follows a response that closes its connection (``Data after
            # Connection: close``): the response itself is whole.
            self.extra = True
        finally:
            _FORWARD.current = None
        if self._quiet > MAX_HEAD_BYTES:
            what = "head" if self._head is None else "run of framing bytes"
            raise H1Error(f"a response {what} larger than {MAX_HEAD_BYTES} bytes")
        return self._head

    @property
    def pending(self) -> bool:
        """Body bytes are parsed and not yet taken."""
        return bool(self._pieces)

    def pieces(self) -> list[bytes]:
        """The body's bytes parsed so far and not yet taken, decoded."""
        pieces, self._pieces = self._pieces, []
        decoder = self._decoder
        if decoder is None:
            return pieces
        decoded = 0
        out: list[bytes] = []
        try:
            for piece in pieces:
                while piece:
                    data = decoder.decompress(piece, MAX_DECODED_BYTES_PER_READ - decoded + 1)
                    decoded += len(data)
                    if decoded > MAX_DECODED_BYTES_PER_READ or decoder.unconsumed_tail:
                        raise H1Error(
                            "a compressed body that decodes to more than "
                            f"{MAX_DECODED_BYTES_PER_READ} bytes from one read"
                        )
                    if data:
                        out.append(data)
                    piece = b""
                    if decoder.eof and decoder.unused_data:
                        if self._wbits != _DECODERS["gzip"]:
                            raise H1Error("bytes after the end of a compressed body")
                        # gzip allows members one after another: each decodes on its own.
                        piece = decoder.unused_data
                        decoder = self._decoder = zlib.decompressobj(self._wbits)
        except zlib.error as exc:
            raise H1Error(f"a compressed body that does not decode: {exc}") from None
        if self.done and not decoder.eof:
            raise H1Error("a compressed body that ends before its compressed stream does")
        return out

    def eof(self) -> None:
        """The connection ended: the end of a body framed by it, else a body cut short."""
        if self._head is not None and self.until_close and not self.done:
            self.done = True
            return
        if not self.done:
            raise H1Error("connection lost (the body ended before its end)")


_FORWARD = Forward(ResponseParser)


class _Stop(Exception):
    """Stops llhttp after the response (it would parse on into whatever follows)."""
