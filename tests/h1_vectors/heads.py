"""The request head (its lines, Host, the version, the method), the bounds on a head and on a
body, and Expect: 100-continue."""

from __future__ import annotations

from tests.h1_vectors.wire import (
    CHUNKED,
    HEAD_BOUND,
    HELLO,
    MAX_BODY_BYTES,
    Corpus,
    chunk,
    chunked,
    get,
    head,
    post,
    split,
    te_head,
)


def add_to(corpus: Corpus) -> None:
    add = corpus.add

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
