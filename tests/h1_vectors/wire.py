"""The building blocks of the raw request vectors: the ``Vector`` itself, its families, and the
helpers that write request bytes (heads, chunks, cuts across writes)."""

from __future__ import annotations

from itertools import pairwise
from typing import Literal

import attrs

# The server's bound on a request head, as fronts/h1_parse.MAX_HEAD_BYTES has it today.
HEAD_BOUND = 64 * 1024
# The body limit the test gives the server (today: its app, as fronts/http.read_body does).
MAX_BODY_BYTES = 1024 * 1024

Family = Literal[
    "valid",  # edge cases a server must accept
    "pipeline",  # 2 to 5 requests in one write
    "split",  # one request or more, written at awkward offsets
    "content-length",
    "transfer-encoding",
    "cl.te",  # Content-Length and Transfer-Encoding, the front reads one, the back the other
    "te.cl",
    "te.te",  # an obfuscated Transfer-Encoding one side may not recognise
    "chunked",  # chunk sizes, extensions, line ends
    "trailers",
    "head",  # the request line and header lines
    "host",
    "version",
    "method",
    "limits",  # the head's bound and the body's
    "expect",
]


@attrs.frozen(kw_only=True)
class Vector:
    name: str
    family: Family
    writes: tuple[bytes, ...]

    @property
    def data(self) -> bytes:
        return b"".join(self.writes)


def head(*lines: str | bytes) -> bytes:
    """A request head: the lines with CRLF after each, and the blank line."""
    raw = [line.encode("latin-1") if isinstance(line, str) else line for line in lines]
    return b"".join(line + b"\r\n" for line in raw) + b"\r\n"


def get(path: str = "/", *headers: str) -> bytes:
    return head(f"GET {path} HTTP/1.1", "Host: x", *headers)


def post(body: bytes, path: str = "/p", *headers: str) -> bytes:
    return head(f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *headers) + body


def chunk(data: bytes, ext: bytes = b"") -> bytes:
    return b"%x%b\r\n%b\r\n" % (len(data), ext, data)


def chunked(*chunks: bytes, path: str = "/c", trailers: bytes = b"\r\n") -> bytes:
    """A chunked POST: its chunks (``chunk()`` each, or raw framing), the last chunk, then
    ``trailers`` (the trailer section with its blank line)."""
    te = head(f"POST {path} HTTP/1.1", "Host: x", "Transfer-Encoding: chunked")
    return te + b"".join(chunks) + b"0\r\n" + trailers


def te_head(*lines: str | bytes) -> bytes:
    """A POST head with the given header lines (framing headers chosen by the vector)."""
    return head("POST /t HTTP/1.1", "Host: x", *lines)


def split(data: bytes, *offsets: int) -> tuple[bytes, ...]:
    """``data`` cut at these offsets (negative ones count from the end)."""
    cuts = sorted({o if o >= 0 else len(data) + o for o in offsets})
    bounds = [0, *cuts, len(data)]
    return tuple(data[a:b] for a, b in pairwise(bounds) if b > a)


def every(data: bytes, size: int) -> tuple[bytes, ...]:
    return tuple(data[i : i + size] for i in range(0, len(data), size))


SECOND = get("/second")  # a request after the one under test, in the same write
HELLO = chunk(b"hello")
CHUNKED = "Transfer-Encoding: chunked"


@attrs.define
class Corpus:
    """The vectors in the order added: the modules of each kind of vector add theirs in turn."""

    vectors: list[Vector] = attrs.Factory(list)

    def add(self, name: str, family: Family, *writes: bytes) -> None:
        self.vectors.append(Vector(name=name, family=family, writes=writes))
