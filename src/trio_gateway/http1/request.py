"""A client's requests parsed by llhttp (httptools) in its strict mode: pure, bounded, no I/O.

llhttp is the parser of Node.js, strict by default and among the most fuzzed HTTP/1 parsers:
it refuses ``Transfer-Encoding`` with ``Content-Length``, two ``Content-Length``s, a length or a
chunk size that is not plain digits, bare CR or LF, obs-fold, a trailer that is not a field.
What this module adds is what llhttp leaves to its user, or takes where h11 (the strict
pure-Python parser) does not:

- the bounds: a head of at most ``MAX_HEAD_BYTES`` and ``MAX_HEADERS`` lines, a body of at most
  ``max_body_bytes`` (refused from the head when declared), trailers and chunk-size lines
  bounded (``chunks.py``);
- the rules of RFC 9112 that llhttp does not hold a request to: one ``Host`` (none on 1.0), a
  transfer coding of exactly ``chunked`` and never on HTTP/1.0, HTTP/1.0 or 1.1 only, a request
  line of single spaces, at most 19 digits of ``Content-Length``;
- that llhttp never reads past the request it is given. A connection's next request is parsed
  only once this one is answered, so the parser is fed exactly this request's bytes: the head
  up to its blank line (strict CRLF makes the first CRLF CRLF its end), then the body's bytes
  (its length, or what ``chunks.ChunkFramer`` finds), and llhttp must agree that the request
  ends there.

Every refusal is an :class:`~trio_gateway.http1.errors.H1Error` carrying the status to answer.
"""

from __future__ import annotations

import re
from typing import Literal

import attrs
import httptools

from trio_gateway.http1.callbacks import Forward
from trio_gateway.http1.chunks import ChunkFramer
from trio_gateway.http1.errors import H1Error, body_too_large

MAX_HEAD_BYTES = 64 * 1024  # nginx's large_client_header_buffers, 4 x 8 KiB, is less
MAX_HEADERS = 256
MAX_LENGTH_DIGITS = 19  # every 19-digit length fits in 63 bits
HEAD_END = b"\r\n\r\n"
# HTTP/2 with prior knowledge opens with this line, a blank line, "SM" and another.
H2_PREFACE = b"PRI * HTTP/2.0\r\n"
_DIGITS = re.compile(rb"[0-9]{1,%d}" % MAX_LENGTH_DIGITS)

Framing = Literal["none", "length", "chunked"]


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


def find_head_end(buffer: bytes, start: int = 0) -> int | None:
    """Where the head in ``buffer`` ends (after its blank line), once it holds a whole one.
    ``start``: how far an earlier look got (the search resumes just before it)."""
    at = buffer.find(HEAD_END, max(0, start - 3))
    return None if at < 0 else at + len(HEAD_END)


class RequestParser:
    """One connection's requests, one at a time: :meth:`head` with a whole head, then
    :meth:`body` with the bytes after it until :attr:`body_done`; then the next :meth:`head`.

    After any :class:`H1Error` the parser is spent (so is the connection). llhttp's own parser
    lives from a head to its request's end: not held through the answer (thousands at once)."""

    def __init__(self, *, max_body_bytes: int, limit_name: str = "the limit") -> None:
        self.max_body_bytes = max_body_bytes
        self.limit_name = limit_name  # what a 413 calls the limit
        self._parser: httptools.HttpRequestParser | None = None
        self._reset()

    def _reset(self) -> None:
        self._began = False
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._headers_done = False
        self._complete = False
        self._pieces: list[bytes] = []
        self._body_bytes = 0
        self._remaining = 0
        self._framer: ChunkFramer | None = None
        self.body_done = True

    # --- llhttp's callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._began:
            # llhttp ended the request before the bytes given to it did: the two disagree on
            # where it ends, and that is exactly what request smuggling is made of.
            raise H1Error("the request's framing is ambiguous")
        self._began = True

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._headers_done:
            return  # a trailer: checked by llhttp, bounded by the framer, not kept
        if len(self._headers) >= MAX_HEADERS:
            raise H1Error(f"more than {MAX_HEADERS} header lines", 431)
        # llhttp drops the whitespace before a value, not after it (RFC 9112 section 5.1: it is
        # not part of the value).
        self._headers.append((name.lower(), value.rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.max_body_bytes:
            raise H1Error(body_too_large(self.limit_name, self.max_body_bytes), 413)
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        self._complete = True

    def _feed(self, data: bytes) -> None:
        parser = self._parser
        assert parser is not None
        _FORWARD.current = self
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # Upgrade or CONNECT: the head is whole; what follows is not HTTP/1.x's
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, H1Error):
                raise cause from None
            raise H1Error(f"malformed request: {exc}") from None
        except httptools.HttpParserInvalidMethodError:
            raise H1Error("an unknown method", 501) from None
        except httptools.HttpParserError as exc:
            reason = str(exc)
            raise H1Error(f"malformed request: {reason}", _status_of(reason)) from None
        finally:
            _FORWARD.current = None

    # --- the head -----------------------------------------------------------------------------

    def head(self, block: bytes) -> RequestHead:
        """The request whose head is ``block``, its blank line included (:func:`find_head_end`)."""
        self._reset()
        self._parser = parser = httptools.HttpRequestParser(_FORWARD)
        if len(block) > MAX_HEAD_BYTES:
            raise H1Error(f"a request head larger than {MAX_HEAD_BYTES} bytes", 431)
        line_end = block.find(b"\r\n")
        if line_end <= 0 or not block[:1].isalpha():
            # llhttp skips blank lines before a request line (RFC 9112 lets it); h11 refuses
            # them, and so does this server: no client needs them, and a proxy may count them.
            raise H1Error("a request must begin with its request line")
        request_line = block[:line_end]
        if request_line.count(b" ") != 2:
            raise H1Error(f"not a request line: {request_line[:80]!r}")
        self._feed(block)
        if not self._headers_done:
            raise H1Error("malformed request: the head did not end at its blank line")
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise H1Error(f"HTTP version {version} is not supported", 505)
        head = _head(parser.get_method().decode("ascii"), self._url, version, self._headers)
        if head.content_length > self.max_body_bytes:
            message = body_too_large(self.limit_name, self.max_body_bytes, head.content_length)
            raise H1Error(message, 413)
        if head.upgrade:
            self.body_done = True  # not read here: the connection is handed on whole
        elif head.framing == "chunked":
            self._framer = ChunkFramer(
                max_line_bytes=MAX_HEAD_BYTES, max_trailer_bytes=MAX_HEAD_BYTES
            )
            self.body_done = False
        else:
            self._remaining = head.content_length
            self.body_done = not self._remaining
            if self.body_done and not self._complete:
                raise H1Error("malformed request: a body the head does not declare")
        if self.body_done:
            self._parser = None
        return head

    # --- the body -----------------------------------------------------------------------------

    def body(self, data: bytes) -> tuple[list[bytes], int]:
        """The body's bytes in ``data`` (as llhttp gives them) and how many of ``data``'s bytes
        were the body's; what follows is the next request's."""
        if self.body_done:
            return [], 0
        framer = self._framer
        if framer is not None:
            used = framer.scan(data)
            ended = framer.done
        else:
            used = min(self._remaining, len(data))
            self._remaining -= used
            ended = not self._remaining
        self._feed(data[:used] if used < len(data) else data)
        if ended != self._complete:
            raise H1Error("malformed request: the body's framing is ambiguous")
        self.body_done = ended
        if ended:
            self._parser = None
        pieces, self._pieces = self._pieces, []
        return pieces, used


_FORWARD = Forward(RequestParser)


def _status_of(reason: str) -> int:
    """The answer to one of llhttp's refusals (it names them in words only)."""
    if "HTTP version" in reason:
        return 505
    # "Request has invalid `Transfer-Encoding`" (chunked is not the last coding) is a 400 too:
    # the body's length cannot be known (RFC 9112 section 6.3). A coding not understood before
    # a final chunked is a 501 (section 6.1): _head's.
    return 400


def _head(method: str, url: bytes, version: str, headers: list[tuple[bytes, bytes]]) -> RequestHead:
    """The request's meaning from its parsed head, and the rules llhttp leaves to its user."""
    http11 = version == "1.1"
    hosts = 0
    lengths: list[bytes] = []
    codings: list[bytes] = []
    connection: set[bytes] = set()
    expect = b""
    upgrade = False
    if method == "CONNECT":
        raise H1Error("CONNECT: this server is not a proxy")
    for name, value in headers:
        if name == b"host":
            hosts += 1
        elif name == b"content-length":
            lengths.append(value)
        elif name == b"transfer-encoding":
            codings.append(value.strip(b" \t").lower())
        elif name == b"connection":
            connection |= {v.strip(b" \t").lower() for v in value.split(b",")}
        elif name == b"expect":
            expect = value.lower()
        elif name == b"upgrade":
            upgrade = True
    if hosts > 1 or (http11 and not hosts):
        raise H1Error("a request needs one Host header (HTTP/1.0: at most one)")
    framing: Framing = "none"
    length = 0
    if codings:
        # llhttp has refused it with a Content-Length, twice, or not ending in chunked.
        if not http11:
            raise H1Error("Transfer-Encoding is not HTTP/1.0")
        if codings != [b"chunked"]:
            raise H1Error("only the chunked transfer coding is supported", 501)
        framing = "chunked"
    elif lengths:
        # llhttp has refused two of them, and anything but digits.
        text = lengths[0].strip(b" \t")
        if not _DIGITS.fullmatch(text):
            raise H1Error(f"a Content-Length of more than {MAX_LENGTH_DIGITS} digits")
        length = int(text)
        framing = "length" if length else "none"
    keep_alive = b"close" not in connection and (http11 or b"keep-alive" in connection)
    return RequestHead(
        method=method,
        target=url,
        http_version=version,
        headers=headers,
        framing=framing,
        content_length=length,
        keep_alive=keep_alive,
        expect_continue=http11 and expect == b"100-continue" and framing != "none",
        upgrade=upgrade,
    )
