"""Requests a server must frame and answer, whatever the reads: edge cases of valid requests,
pipelines of 2 to 5, and framing cut across writes at awkward offsets."""

from __future__ import annotations

from tests.h1_vectors.wire import (
    HELLO,
    Corpus,
    chunk,
    chunked,
    every,
    get,
    head,
    post,
    split,
    te_head,
)


def add_to(corpus: Corpus) -> None:
    add = corpus.add

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
