"""Where a body ends: Content-Length and Transfer-Encoding in their malformed forms, the two
together (the classic CL.TE, TE.CL and TE.TE smuggling forms), chunk framing and trailers."""

from __future__ import annotations

from tests.h1_vectors.wire import (
    CHUNKED,
    HELLO,
    SECOND,
    Corpus,
    chunk,
    chunked,
    get,
    head,
    te_head,
)


def add_to(corpus: Corpus) -> None:
    add = corpus.add

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
