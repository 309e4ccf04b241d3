"""Raw HTTP/1.x request vectors for the differential test of the gateway's front against h11
(issue 26, item 3: ``tests/e2e/test_h1_differential.py``).

A vector is bytes and nothing else: a name, a family, and what the client writes (in several
writes where the framing should be read across reads). What the server ought to do with them
is never written here: it is what h11 does (``tests/h1_reference.py``), except for the
deliberate differences the test lists with their reasons. Every conversation ends with the
test's own sentinel request, appended to the last write.

No vector asks for an Upgrade or CONNECT: those are handed to another server.
"""

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


def _corpus() -> list[Vector]:
    out: list[Vector] = []

    def add(name: str, family: Family, *writes: bytes) -> None:
        out.append(Vector(name=name, family=family, writes=writes))

    # --- valid: edge cases that must be accepted ----------------------------------------------
    add("get", "valid", get())
    add("post-length", "valid", post(b"hello"))
    add("post-length-zero", "valid", post(b""))
    add("post-empty-without-length", "valid", head("POST /p HTTP/1.1", "Host: x"))
    add("chunked", "valid", chunked(HELLO, chunk(b" world")))
    add(
        "chunked-extensions",
        "valid",
        chunked(chunk(b"hello", b";name=value"), chunk(b" world", b";a;b=c")),
    )
    add("chunked-extension-quoted", "valid", chunked(chunk(b"hello", b';name="quoted value"')))
    add("chunked-last-chunk-extension", "valid", chunked(HELLO).replace(b"0\r\n", b"0;end=1\r\n"))
    add("chunked-trailers", "valid", chunked(HELLO, trailers=b"X-Sum: abc\r\nX-Other: 1\r\n\r\n"))
    add(
        "chunked-hex-digits-any-case",
        "valid",
        chunked(b"a\r\n" + b"0" * 10 + b"\r\n", b"A\r\n" + b"1" * 10 + b"\r\n", chunk(b"2" * 255)),
    )
    add("chunked-size-leading-zeros", "valid", chunked(b"005\r\nhello\r\n"))
    add("chunked-size-16-hex-digits", "valid", chunked(b"0000000000000005\r\nhello\r\n"))
    add(
        "chunked-one-byte-chunks",
        "valid",
        chunked(*[chunk(b"%c" % (65 + i % 26)) for i in range(200)]),
    )
    add(
        "chunked-data-looks-like-a-request",
        "valid",
        chunked(chunk(get("/inner")), chunk(b"0\r\n\r\n")),
    )
    add("length-body-looks-like-a-request", "valid", post(get("/inner") + b"0\r\n\r\n"))
    add("http10-get-closes", "valid", head("GET /ten HTTP/1.0"))
    add("http10-keep-alive", "valid", head("GET /ten HTTP/1.0", "Connection: keep-alive"))
    add(
        "http10-post-keep-alive",
        "valid",
        head("POST /ten HTTP/1.0", "Content-Length: 5", "Connection: Keep-Alive") + b"hello",
    )
    add(
        "http10-keep-alive-and-close",
        "valid",
        head("GET /ten HTTP/1.0", "Connection: keep-alive, close"),
    )
    add("http10-with-host", "valid", head("GET /ten HTTP/1.0", "Host: x"))
    add("connection-close-ends-it", "valid", get("/last", "Connection: close") + get("/never"))
    add("connection-close-any-case", "valid", get("/last", "Connection: CLOSE") + get("/never"))
    add("keep-alive-explicit", "valid", get("/", "Connection: keep-alive"))
    add("connection-other-tokens", "valid", get("/", "Connection: foo, bar"))
    add("absolute-form-target", "valid", head("GET http://x/a/b?c=d HTTP/1.1", "Host: x"))
    add("options-asterisk", "valid", head("OPTIONS * HTTP/1.1", "Host: x"))
    add("query-target", "valid", get("/a/b?c=d&e=%20f"))
    add("percent-encoded-target", "valid", get("/a%2Fb%20c"))
    add(
        "ows-around-values",
        "valid",
        head("GET / HTTP/1.1", "Host:   x   ", "X-A:\tv\t", "X-B: \t w \t"),
    )
    add("no-ows", "valid", head("POST /p HTTP/1.1", "Host:x", "Content-Length:5") + b"hello")
    add(
        "header-names-odd-case",
        "valid",
        head("POST /p HTTP/1.1", "hOsT: x", "cOnTeNt-LeNgTh: 5") + b"hello",
    )
    add(
        "header-names-upper-case",
        "valid",
        head("POST /p HTTP/1.1", "HOST: x", "CONTENT-LENGTH: 5") + b"hello",
    )
    add("empty-header-values", "valid", get("/", "X-Empty:", "X-Blank: "))
    add("obs-text-in-value", "valid", head("GET / HTTP/1.1", "Host: x", b"X-Latin: caf\xe9 \xff"))
    add("tab-inside-value", "valid", get("/", "X-Tab: a\tb"))
    add("host-with-port", "valid", head("GET / HTTP/1.1", "Host: x:8080"))
    add("host-empty", "valid", head("GET / HTTP/1.1", "Host:"))
    add("many-headers", "valid", get("/", *[f"X-H{i}: {i}" for i in range(100)]))
    add("long-target", "valid", get("/" + "a" * 8000))
    add("content-length-leading-zeros", "valid", te_head("Content-Length: 005") + b"hello")
    add(
        "content-length-19-digits",
        "valid",
        te_head("Content-Length: 0000000000000000005") + b"hello",
    )
    add("content-length-ows", "valid", te_head("Content-Length:  5 ") + b"hello")
    add("put", "valid", head("PUT /r HTTP/1.1", "Host: x", "Content-Length: 3") + b"put")
    add("delete", "valid", head("DELETE /r HTTP/1.1", "Host: x"))
    add("patch", "valid", head("PATCH /r HTTP/1.1", "Host: x", "Content-Length: 5") + b"patch")
    add(
        "typical-json-post",
        "valid",
        post(
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
            "/v1/chat/completions",
            "Content-Type: application/json",
            "Authorization: Bearer sk-test",
            "User-Agent: curl/8.5.0",
            "Accept: */*",
        ),
    )

    # --- pipeline: 2 to 5 requests in one write ------------------------------------------------
    add("pipeline-2-get", "pipeline", get("/1") + get("/2"))
    add(
        "pipeline-3-post-length",
        "pipeline",
        post(b"a", "/1") + post(b"bb", "/2") + post(b"ccc", "/3"),
    )
    add("pipeline-get-chunked-get", "pipeline", get("/1") + chunked(HELLO, path="/2") + get("/3"))
    five = (
        get("/1")
        + post(b"hello", "/2")
        + chunked(HELLO, chunk(b"!"), path="/3", trailers=b"X-T: 1\r\n\r\n")
        + post(b"", "/4")
        + get("/5")
    )
    add("pipeline-5-mixed", "pipeline", five)
    add(
        "pipeline-4-chunked",
        "pipeline",
        b"".join(chunked(chunk(b"%d" % i), path=f"/{i}") for i in range(4)),
    )
    add(
        "pipeline-close-in-the-middle",
        "pipeline",
        get("/1") + get("/2", "Connection: close") + get("/3"),
    )
    add(
        "pipeline-http10-keep-alive-then-11",
        "pipeline",
        head("GET /1 HTTP/1.0", "Connection: keep-alive") + get("/2"),
    )
    add("pipeline-5-in-7-byte-writes", "pipeline", *every(five, 7))
    add(
        "pipeline-expect-continue",
        "pipeline",
        post(b"one", "/1", "Expect: 100-continue") + post(b"two", "/2", "Expect: 100-continue"),
    )

    # --- split: framing read across reads ------------------------------------------------------
    g = get("/split")
    add("split-in-request-line", "split", *split(g, 2))
    add("split-in-header-name", "split", *split(g, g.index(b"Host") + 2))
    add("split-between-cr-and-lf", "split", *split(g, -1))
    add("split-in-blank-line", "split", *split(g, -2))
    add("split-before-blank-line", "split", *split(g, -3))
    p = post(b"0123456789")
    add("split-length-body-byte-by-byte", "split", *split(p, *range(len(p) - 10, len(p))))
    c = chunked(HELLO, chunk(b" world"))
    body = c.index(b"\r\n\r\n") + 4
    add("split-chunk-size-and-crlf", "split", *split(c, body + 1, body + 2))
    add("split-inside-chunk-data", "split", *split(c, body + 5))
    add("split-chunk-data-and-crlf", "split", *split(c, body + 8, body + 9))
    add("split-last-chunk", "split", *split(c, -2))
    add("split-last-chunk-cr", "split", *split(c, -4, -3))
    add("split-in-chunk-size", "split", *split(chunked(chunk(b"x" * 16)), body + 1))
    add("split-in-chunk-extension", "split", *split(chunked(chunk(b"hello", b";name=v")), body + 4))
    t = chunked(HELLO, trailers=b"X-Trailer: 1\r\n\r\n")
    add("split-in-trailers", "split", *split(t, -10, -2))
    add("split-byte-by-byte-get", "split", *every(get("/b"), 1))
    add(
        "split-byte-by-byte-chunked",
        "split",
        *every(chunked(chunk(b"hi", b";e=1"), trailers=b"T: v\r\n\r\n"), 1),
    )
    two = post(b"first", "/1") + post(b"second", "/2")
    add(
        "split-next-head-with-body-end", "split", *split(two, two.index(b"first") + 3, len(two) - 8)
    )
    add("split-chunked-then-next-head", "split", *split(c + get("/2"), len(c) - 2, len(c) + 5))

    # --- content-length --------------------------------------------------------------------------
    add(
        "cl-duplicate-identical",
        "content-length",
        te_head("Content-Length: 5", "Content-Length: 5") + b"hello",
    )
    add("cl-list-identical", "content-length", te_head("Content-Length: 5, 5") + b"hello")
    add(
        "cl-duplicate-conflicting",
        "content-length",
        te_head("Content-Length: 5", "Content-Length: 6") + b"hello!",
    )
    add("cl-list-conflicting", "content-length", te_head("Content-Length: 5, 6") + b"hello!")
    add("cl-plus", "content-length", te_head("Content-Length: +5") + b"hello")
    add("cl-minus", "content-length", te_head("Content-Length: -5") + b"hello")
    add("cl-minus-zero", "content-length", te_head("Content-Length: -0"))
    add("cl-hex", "content-length", te_head("Content-Length: 0x5") + b"hello")
    add("cl-underscore", "content-length", te_head("Content-Length: 1_0") + b"0123456789")
    add("cl-inner-space", "content-length", te_head("Content-Length: 1 0") + b"0123456789")
    add("cl-empty", "content-length", te_head("Content-Length:"))
    add("cl-trailing-comma", "content-length", te_head("Content-Length: 5,") + b"hello")
    add("cl-comma-only", "content-length", te_head("Content-Length: ,"))
    add("cl-5000-digits", "content-length", te_head("Content-Length: " + "1" * 5000) + b"hello")
    add("cl-25-digits", "content-length", te_head("Content-Length: " + "0" * 24 + "5") + b"hello")
    add("cl-20-digits", "content-length", te_head("Content-Length: " + "0" * 19 + "5") + b"hello")
    add("cl-fullwidth-digit", "content-length", te_head(b"Content-Length: \xef\xbc\x95") + b"hello")
    add("cl-vertical-tab", "content-length", te_head(b"Content-Length: \x0b5") + b"hello")
    add("cl-form-feed", "content-length", te_head(b"Content-Length: 5\x0c") + b"hello")
    add("cl-shorter-than-body", "content-length", te_head("Content-Length: 3") + b"abcdef")
    add("cl-longer-swallows-next", "content-length", te_head("Content-Length: 10") + b"abc")
    # The sentinel too is body: the server waits for the rest until its body timeout.
    add("cl-body-never-ends", "content-length", te_head("Content-Length: 200") + b"abc")

    # --- transfer-encoding -----------------------------------------------------------------------
    add("te-gzip", "transfer-encoding", te_head("Transfer-Encoding: gzip") + HELLO + b"0\r\n\r\n")
    add(
        "te-gzip-chunked",
        "transfer-encoding",
        te_head("Transfer-Encoding: gzip, chunked") + HELLO + b"0\r\n\r\n",
    )
    add(
        "te-chunked-gzip",
        "transfer-encoding",
        te_head("Transfer-Encoding: chunked, gzip") + HELLO + b"0\r\n\r\n",
    )
    add(
        "te-chunked-trailing-comma",
        "transfer-encoding",
        te_head("Transfer-Encoding: chunked,") + HELLO + b"0\r\n\r\n" + SECOND,
    )
    add(
        "te-chunked-twice-in-list",
        "transfer-encoding",
        te_head("Transfer-Encoding: chunked, chunked") + HELLO + b"0\r\n\r\n",
    )
    add("te-identity", "transfer-encoding", te_head("Transfer-Encoding: identity") + b"hello")
    add("te-empty", "transfer-encoding", te_head("Transfer-Encoding:") + HELLO + b"0\r\n\r\n")
    add(
        "te-parameter",
        "transfer-encoding",
        te_head("Transfer-Encoding: chunked;q=1") + HELLO + b"0\r\n\r\n",
    )
    add(
        "te-quoted",
        "transfer-encoding",
        te_head('Transfer-Encoding: "chunked"') + HELLO + b"0\r\n\r\n",
    )
    add("te-chunk", "transfer-encoding", te_head("Transfer-Encoding: chunk") + HELLO + b"0\r\n\r\n")
    add("te-http10", "transfer-encoding", head("POST /t HTTP/1.0", CHUNKED) + HELLO + b"0\r\n\r\n")
    add(
        "te-http10-keep-alive",
        "transfer-encoding",
        head("POST /t HTTP/1.0", CHUNKED, "Connection: keep-alive") + HELLO + b"0\r\n\r\n",
    )

    # --- CL.TE, TE.CL, TE.TE: the classic smuggling forms ---------------------------------------
    smuggled = b"0\r\n\r\n" + get("/admin")
    add("clte-classic", "cl.te", te_head("Content-Length: 6", CHUNKED) + b"0\r\n\r\nG")
    add("clte-te-first", "cl.te", te_head(CHUNKED, "Content-Length: 6") + b"0\r\n\r\nG")
    add(
        "clte-smuggled-request",
        "cl.te",
        te_head(f"Content-Length: {len(smuggled)}", CHUNKED) + smuggled,
    )
    add("clte-length-zero", "cl.te", te_head("Content-Length: 0", CHUNKED) + HELLO + b"0\r\n\r\n")
    add(
        "clte-http10",
        "cl.te",
        head("POST /t HTTP/1.0", "Content-Length: 6", CHUNKED) + b"0\r\n\r\nG",
    )
    inner = b"GPOST / HTTP/1.1\r\nContent-Type: x\r\nContent-Length: 15\r\n\r\nx=1"
    tecl = b"%x\r\n%b\r\n0\r\n\r\n" % (len(inner), inner)
    add("tecl-classic", "te.cl", te_head("Content-Length: 4", CHUNKED) + tecl)
    add("tecl-te-first", "te.cl", te_head(CHUNKED, "Content-Length: 4") + tecl)
    add(
        "tecl-length-covers-one-chunk",
        "te.cl",
        te_head("Content-Length: 10", CHUNKED) + HELLO + b"0\r\n\r\n",
    )
    add(
        "tete-xchunked", "te.te", te_head("Content-Length: 4", "Transfer-Encoding: xchunked") + tecl
    )
    add("tete-leading-ows", "te.te", te_head("Transfer-Encoding:   chunked") + HELLO + b"0\r\n\r\n")
    add(
        "tete-trailing-ows", "te.te", te_head("Transfer-Encoding: chunked  ") + HELLO + b"0\r\n\r\n"
    )
    add("tete-tab", "te.te", te_head("Transfer-Encoding:\tchunked") + HELLO + b"0\r\n\r\n")
    add(
        "tete-space-before-colon",
        "te.te",
        te_head("Transfer-Encoding : chunked") + HELLO + b"0\r\n\r\n",
    )
    add(
        "tete-space-before-colon-with-cl",
        "te.te",
        te_head("Content-Length: 4", "Transfer-Encoding : chunked") + tecl,
    )
    add("tete-duplicate", "te.te", te_head(CHUNKED, CHUNKED) + HELLO + b"0\r\n\r\n")
    add(
        "tete-duplicate-identity",
        "te.te",
        te_head(CHUNKED, "Transfer-Encoding: identity") + HELLO + b"0\r\n\r\n",
    )
    add(
        "tete-chunked-identity",
        "te.te",
        te_head("Transfer-Encoding: chunked, identity") + HELLO + b"0\r\n\r\n",
    )
    add(
        "tete-identity-chunked",
        "te.te",
        te_head("Transfer-Encoding: identity, chunked") + HELLO + b"0\r\n\r\n",
    )
    add(
        "tete-upper-case-value",
        "te.te",
        te_head("Transfer-Encoding: CHUNKED") + HELLO + b"0\r\n\r\n",
    )
    add(
        "tete-upper-case-name",
        "te.te",
        te_head("TRANSFER-ENCODING: chunked") + HELLO + b"0\r\n\r\n",
    )
    add(
        "tete-folded-into-previous",
        "te.te",
        head("POST /t HTTP/1.1", "Content-Length: 5", "Host: x", " Transfer-Encoding: chunked")
        + b"hello",
    )
    add(
        "tete-folded-first-line",
        "te.te",
        head("POST /t HTTP/1.1", " Transfer-Encoding: chunked", "Host: x") + HELLO + b"0\r\n\r\n",
    )
    add(
        "tete-vertical-tab",
        "te.te",
        te_head(b"Transfer-Encoding:\x0bchunked") + HELLO + b"0\r\n\r\n",
    )
    add(
        "tete-form-feed", "te.te", te_head(b"Transfer-Encoding: \x0cchunked") + HELLO + b"0\r\n\r\n"
    )
    add("tete-nul", "te.te", te_head(b"Transfer-Encoding: chunked\x00") + HELLO + b"0\r\n\r\n")
    add(
        "tete-underscore-name",
        "te.te",
        te_head("Transfer_Encoding: chunked") + HELLO + b"0\r\n\r\n",
    )

    # --- chunked framing -----------------------------------------------------------------------
    add("chunk-size-underscore", "chunked", chunked(b"1_0\r\n" + b"x" * 16 + b"\r\n") + SECOND)
    add("chunk-size-form-feed", "chunked", chunked(b"\x0c5\r\nhello\r\n") + SECOND)
    add("chunk-size-leading-space", "chunked", chunked(b" 5\r\nhello\r\n") + SECOND)
    add("chunk-size-trailing-space", "chunked", chunked(b"5 \r\nhello\r\n") + SECOND)
    add("chunk-size-trailing-tab", "chunked", chunked(b"5\t\r\nhello\r\n") + SECOND)
    add("chunk-size-space-before-extension", "chunked", chunked(b"5 ;a=b\r\nhello\r\n") + SECOND)
    add("chunk-extension-trailing-space", "chunked", chunked(b"5;a=b \r\nhello\r\n") + SECOND)
    add("chunk-size-cr-cr-lf", "chunked", chunked(b"5\r\r\nhello\r\n") + SECOND)
    add("chunk-extension-bare-cr", "chunked", chunked(b"5;a\r\r\nhello\r\n") + SECOND)
    add("chunk-size-bare-lf", "chunked", chunked(b"5\nhello\r\n") + SECOND)
    add("chunk-data-bare-lf", "chunked", chunked(b"5\r\nhello\n") + SECOND)
    add("chunk-last-bare-lf", "chunked", chunked(HELLO).replace(b"0\r\n\r\n", b"0\n\n") + SECOND)
    add("chunk-all-bare-lf", "chunked", te_head(CHUNKED) + b"5\nhello\n0\n\n" + SECOND)
    add("chunk-trailer-section-bare-lf", "chunked", chunked(HELLO, trailers=b"\n") + SECOND)
    add("chunk-size-25-hex-digits", "chunked", chunked(b"0" * 24 + b"5\r\nhello\r\n") + SECOND)
    add("chunk-size-17-hex-digits", "chunked", chunked(b"0" * 16 + b"5\r\nhello\r\n") + SECOND)
    add(
        "chunk-size-2-to-the-64",
        "chunked",
        te_head(CHUNKED) + b"10000000000000000\r\nhello\r\n0\r\n\r\n",
    )
    add("chunk-size-0x", "chunked", chunked(b"0x5\r\nhello\r\n") + SECOND)
    add("chunk-size-plus", "chunked", chunked(b"+5\r\nhello\r\n") + SECOND)
    add("chunk-size-minus", "chunked", chunked(b"-5\r\nhello\r\n") + SECOND)
    add("chunk-size-empty", "chunked", chunked(b"\r\nhello\r\n") + SECOND)
    add("chunk-size-not-hex", "chunked", chunked(b"g\r\nhello\r\n") + SECOND)
    add("chunk-data-longer-than-size", "chunked", chunked(b"5\r\nhelloXX\r\n") + SECOND)
    add("chunk-data-shorter-than-size", "chunked", chunked(b"5\r\nhel\r\n") + SECOND)
    add("chunk-data-without-crlf", "chunked", chunked(b"5\r\nhello") + SECOND)
    add("chunk-extension-nul", "chunked", chunked(b"5;\x00\r\nhello\r\n") + SECOND)
    add("chunk-extension-long", "chunked", chunked(chunk(b"hello", b";n=" + b"v" * 2048)))
    add("chunk-line-past-head-bound", "chunked", chunked(chunk(b"hello", b";n=" + b"v" * 70_000)))

    # --- trailers ------------------------------------------------------------------------------
    add("trailer-request-line", "trailers", chunked(HELLO, trailers=get("/swallowed")))
    add("trailer-not-a-field", "trailers", chunked(HELLO, trailers=b"not a field\r\n\r\n"))
    add("trailer-nul", "trailers", chunked(HELLO, trailers=b"X-T: a\x00b\r\n\r\n"))
    pad = b"".join(b"X-Pad-%d: %b\r\n" % (i, b"a" * 200) for i in range(1000))
    add("trailers-200-kb", "trailers", chunked(HELLO, trailers=pad + b"\r\n"))
    add(
        "trailers-just-under-bound",
        "trailers",
        chunked(HELLO, trailers=b"".join(pad.splitlines(keepends=True)[:150]) + b"\r\n"),
    )
    add("trailer-obs-fold", "trailers", chunked(HELLO, trailers=b"X-T: a\r\n b\r\n\r\n"))
    add("trailer-space-before-colon", "trailers", chunked(HELLO, trailers=b"X-T : a\r\n\r\n"))
    add("trailer-bare-lf", "trailers", chunked(HELLO, trailers=b"X-T: a\n\r\n"))
    add("trailer-bare-cr", "trailers", chunked(HELLO, trailers=b"X-T: a\rb\r\n\r\n"))
    add("trailer-empty-name", "trailers", chunked(HELLO, trailers=b": a\r\n\r\n"))
    add(
        "trailers-many",
        "trailers",
        chunked(HELLO, trailers=b"".join(b"X-%d: %d\r\n" % (i, i) for i in range(50)) + b"\r\n"),
    )

    # --- the head -------------------------------------------------------------------------------
    add("target-not-a-path", "head", get("a/b"))
    add("target-a-colon-first", "head", get(":/"))
    add("obs-fold", "head", get("/", "X-Folded: a", " b"))
    add("obs-fold-tab", "head", get("/", "X-Folded: a", "\tb"))
    add("obs-fold-first-line", "head", head("GET / HTTP/1.1", " X: a", "Host: x"))
    add("space-before-colon", "head", get("/", "X-A : b"))
    add("tab-before-colon", "head", get("/", "X-A\t: b"))
    add("host-space-before-colon", "head", head("GET / HTTP/1.1", "Host : x"))
    add("nul-in-value", "head", get("/", "X-A: a\x00b"))
    add("cr-in-value", "head", get("/", "X-A: a\rb"))
    add("lf-in-value", "head", get("/", "X-A: a\nX-Injected: b"))
    add("bare-lf-head", "head", b"GET / HTTP/1.1\nHost: x\n\n")
    add("bare-lf-head-end", "head", b"GET / HTTP/1.1\r\nHost: x\r\n\n")
    add("bare-cr-head", "head", b"GET / HTTP/1.1\rHost: x\r\r")
    add("control-char-in-value", "head", get("/", "X-A: a\x01b"))
    add("del-in-value", "head", get("/", "X-A: a\x7fb"))
    add("escape-in-value", "head", get("/", "X-A: \x1b[31mred"))
    add("no-colon", "head", get("/", "X-A b"))
    add("empty-name", "head", get("/", ": b"))
    add("bad-name-char", "head", get("/", "X@A: b"))
    add("space-in-name", "head", get("/", "X A: b"))
    add("leading-crlf", "head", b"\r\n" + get())
    add("request-line-double-space", "head", head("GET  / HTTP/1.1", "Host: x"))
    add("request-line-tabs", "head", head("GET\t/\tHTTP/1.1", "Host: x"))
    add("request-line-trailing-space", "head", head("GET / HTTP/1.1 ", "Host: x"))
    add("request-line-no-target", "head", head("GET HTTP/1.1", "Host: x"))
    add("target-control-char", "head", head("GET /a\x01b HTTP/1.1", "Host: x"))
    add("target-non-ascii", "head", head(b"GET /caf\xc3\xa9 HTTP/1.1", "Host: x"))
    add("garbage", "head", b"GARBAGE\r\n\r\n")
    add("tls-client-hello", "head", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 32)

    # --- Host -----------------------------------------------------------------------------------
    add("host-missing", "host", head("GET / HTTP/1.1"))
    add("host-duplicate", "host", head("GET / HTTP/1.1", "Host: x", "Host: x"))
    add("host-duplicate-different", "host", head("GET / HTTP/1.1", "Host: x", "Host: y"))
    add("host-duplicate-http10", "host", head("GET / HTTP/1.0", "Host: x", "Host: y"))
    add("host-missing-http10", "host", head("GET / HTTP/1.0", "Connection: keep-alive"))

    # --- HTTP versions --------------------------------------------------------------------------
    add("http12", "version", head("GET / HTTP/1.2", "Host: x"))
    add("http20", "version", head("GET / HTTP/2.0", "Host: x"))
    add("http30", "version", head("GET / HTTP/3.0", "Host: x"))
    add("http09-no-version", "version", b"GET /\r\n\r\n")
    add("http09-versioned", "version", head("GET / HTTP/0.9"))
    add("http-lower-case", "version", head("GET / http/1.1", "Host: x"))
    add("http-11-without-dot", "version", head("GET / HTTP/11", "Host: x"))
    add("http-1-10", "version", head("GET / HTTP/1.10", "Host: x"))
    add("http-space-in-version", "version", head("GET / HTTP/ 1.1", "Host: x"))

    # --- methods --------------------------------------------------------------------------------
    add("method-lower-case", "method", head("get / HTTP/1.1", "Host: x"))
    add("method-unknown", "method", head("FOO / HTTP/1.1", "Host: x"))
    add("method-with-slash", "method", head("GE/T / HTTP/1.1", "Host: x"))
    add("method-registered-rare", "method", head("PROPFIND /r HTTP/1.1", "Host: x"))

    # --- limits ---------------------------------------------------------------------------------
    filler = "X-Fill: " + "f" * 1000
    base = get("/")
    under = HEAD_BOUND - 200 - len(base)
    add(
        "head-just-under-bound",
        "limits",
        get("/", filler, "X-Pad: " + "p" * (under - len(filler) - 11)),
    )
    add(
        "head-just-over-bound", "limits", get("/", "X-Pad: " + "p" * (HEAD_BOUND + 200 - len(base)))
    )
    add(
        "head-never-ends",
        "limits",
        head("GET / HTTP/1.1", "Host: x")[:-2] + b"X-Pad: " + b"p" * 70_000,
    )
    add("request-line-over-bound", "limits", get("/" + "a" * 70_000))
    add("body-exactly-the-limit", "limits", post(b"b" * MAX_BODY_BYTES))
    add(
        "chunked-body-exactly-the-limit",
        "limits",
        chunked(chunk(b"b" * (MAX_BODY_BYTES // 2)), chunk(b"c" * (MAX_BODY_BYTES // 2))),
    )
    add("body-declared-over-the-limit", "limits", te_head("Content-Length: 1000000000") + b"hello")
    add("body-one-over-the-limit", "limits", post(b"b" * (MAX_BODY_BYTES + 1)))
    add(
        "chunked-body-grown-over-the-limit",
        "limits",
        chunked(*[chunk(b"g" * 65536) for _ in range(17)]),
    )

    # --- Expect: 100-continue -------------------------------------------------------------------
    add("expect-continue", "expect", post(b"hello", "/e", "Expect: 100-continue"))
    add(
        "expect-continue-body-later",
        "expect",
        *split(post(b"hello", "/e", "Expect: 100-continue"), -5),
    )
    add("expect-continue-any-case", "expect", post(b"hello", "/e", "Expect: 100-Continue"))
    add("expect-continue-length-zero", "expect", post(b"", "/e", "Expect: 100-continue"))
    add(
        "expect-continue-chunked",
        "expect",
        te_head("Expect: 100-continue", CHUNKED) + HELLO + b"0\r\n\r\n",
    )
    add(
        "expect-continue-http10",
        "expect",
        head("POST /e HTTP/1.0", "Expect: 100-continue", "Content-Length: 5") + b"hello",
    )
    add("expect-unknown", "expect", post(b"hello", "/e", "Expect: something-else"))
    add(
        "expect-continue-over-the-limit",
        "expect",
        te_head("Expect: 100-continue", f"Content-Length: {MAX_BODY_BYTES + 1}"),
    )
    add(
        "expect-continue-far-over-the-limit",
        "expect",
        te_head("Expect: 100-continue", "Content-Length: 1000000000"),
    )
    add(
        "expect-continue-chunked-grown-over-the-limit",
        "expect",
        te_head("Expect: 100-continue", CHUNKED)
        + b"".join(chunk(b"e" * 65536) for _ in range(17))
        + b"0\r\n\r\n",
    )
    return out


VECTORS: tuple[Vector, ...] = tuple(_corpus())
