"""The gateway's HTTP/1.x front against h11, on real sockets (issue 26, item 3).

Each vector of ``tests/h1_vectors/`` is written to a fresh connection of the real server,
followed by a sentinel request (``GET /__end`` with ``Connection: close``) so that every
conversation has a definite end. The server's app echoes each request (method, target, version,
the body's length and sha256). What the server should do is what h11 does with the same bytes
(``tests/h1_reference.py``):

- where h11 frames the requests, the server answers the same ones, in order, with the same
  method, target and body, and closes after the one that asked (the sentinel, or earlier);
- where h11 refuses the k-th request, the server answers the ones before it as h11 framed them,
  then one error (400, 413, 431, 501 or 505) that says ``connection: close``, and closes;

except for the deliberate differences (``DIFFERENCES``): requests the gateway refuses although
h11 accepts them, each with its reason. A difference is always the gateway being stricter;
where the server is more lenient than h11, the test fails.

Run directly for a table of every vector, h11's verdict, the server's and whether they agree::

    .venv/bin/python -m tests.e2e.test_h1_differential [NAME-SUBSTRING ...]
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal

import attrs
import pytest
import trio
import trio.testing

from tests.h1_reference import Framed, Reference, frame_with_h11
from tests.h1_vectors import HEAD_BOUND, MAX_BODY_BYTES, VECTORS, Vector
from trio_gateway.http1.server import H1Server

SENTINEL = b"GET /__end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
# The server's timeouts: a vector h11 leaves unfinished (a body still to come) ends at them.
SERVER_TIMEOUT_S = 1.0
# A conversation's bound: the server has closed by then, or the vector fails.
CONVERSATION_BOUND_S = 4.0
# What a framing error the client can still hear about is answered with (issue 26).
FRAMING_ERRORS = frozenset({400, 413, 431, 501, 505})


# --- the server, and its app ------------------------------------------------------------------


async def echo(scope: Any, receive: Any, send: Any) -> None:
    """Reads the body (413 once it passes MAX_BODY_BYTES, as fronts/http.read_body refuses);
    answers what it saw: method, raw target, version, the body's length and sha256."""
    digest = hashlib.sha256()
    length = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        part = message.get("body", b"")
        length += len(part)
        if length > MAX_BODY_BYTES:
            await _answer(send, 413, {"error": {"message": "body too large"}})
            return
        digest.update(part)
        if not message.get("more_body", False):
            break
    target = bytes(scope["raw_path"])
    if scope["query_string"]:
        target += b"?" + bytes(scope["query_string"])
    seen = {
        "method": scope["method"],
        "target": target.decode("latin-1"),
        "version": scope["http_version"],
        "length": length,
        "sha256": digest.hexdigest(),
    }
    await _answer(send, 200, seen)


async def _answer(send: Any, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def no_hand_off(stream: trio.abc.Stream) -> None:
    """No vector is an upgrade: one handed off is closed unanswered (and so fails)."""
    await stream.aclose()


@asynccontextmanager
async def serving_strict(timeout_s: float = SERVER_TIMEOUT_S) -> AsyncIterator[int]:
    """The server under test on a free port, with the echo app: the one place it is built."""
    server = H1Server(
        echo,
        no_hand_off,
        keep_alive_timeout_s=timeout_s,
        head_timeout_s=timeout_s,
        body_timeout_s=timeout_s,
        write_timeout_s=timeout_s,
        max_body_bytes=MAX_BODY_BYTES,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(server.hang_ups.serve)
        listeners = await nursery.start(partial(trio.serve_tcp, server.serve, 0, host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


# --- a conversation on the wire -----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Response:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]  # names lower-cased
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        return next((value for key, value in self.headers if key == name), None)

    @property
    def closes(self) -> bool:
        tokens = (self.header(b"connection") or b"").lower().split(b",")
        return b"close" in {token.strip() for token in tokens}

    def describe(self) -> str:
        if self.status == 200:
            return "200"
        return f"{self.status}{'+close' if self.closes else ''}"


@attrs.frozen(kw_only=True)
class Conversation:
    responses: tuple[Response, ...]  # 1xx included, in order
    ended: Literal["eof", "reset", "timeout"]
    garbage: bytes  # what came after the last whole response

    @property
    def finals(self) -> tuple[Response, ...]:
        return tuple(r for r in self.responses if r.status >= 200)

    def describe(self) -> str:
        statuses = " ".join(r.describe() for r in self.responses) or "nothing"
        return f"{statuses}, {self.ended}" + (" +garbage" if self.garbage else "")


async def converse(port: int, vector: Vector) -> Conversation:
    """The vector (and the sentinel, with its last write) on a fresh connection; what comes
    back until the server closes, or CONVERSATION_BOUND_S."""
    writes = (*vector.writes[:-1], vector.writes[-1] + SENTINEL)
    received = bytearray()
    ended: Literal["eof", "reset", "timeout"] = "timeout"
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:

        async def write() -> None:
            for piece in writes:
                try:
                    await stream.send_all(piece)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return  # the server has closed: what it said is still to be read
                # The server has read this write (and is waiting) before the next one goes:
                # each write is a read of its own.
                await trio.testing.wait_all_tasks_blocked()

        with trio.move_on_after(CONVERSATION_BOUND_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write)
                while True:
                    try:
                        data = await stream.receive_some(65536)
                    except trio.BrokenResourceError:
                        ended = "reset"
                        break
                    if not data:
                        ended = "eof"
                        break
                    received += data
                nursery.cancel_scope.cancel()
    responses, garbage = parse_responses(bytes(received))
    return Conversation(responses=responses, ended=ended, garbage=garbage)


_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9]) [\t -~]*")


def parse_responses(data: bytes) -> tuple[tuple[Response, ...], bytes]:
    """The whole responses in ``data``, strictly (CRLF only; a body by its content-length or
    chunks, else to the end), and what follows the last one."""
    out: list[Response] = []
    rest = data
    while rest:
        end = rest.find(b"\r\n\r\n")
        if end < 0:
            break
        status_line, *lines = rest[:end].split(b"\r\n")
        match = _STATUS_LINE.fullmatch(status_line)
        if match is None:
            break
        headers = []
        for line in lines:
            name, sep, value = line.partition(b":")
            if not sep:
                return tuple(out), rest
            headers.append((name.lower(), value.strip(b" \t")))
        status = int(match.group(1))
        after = rest[end + 4 :]
        response = Response(status=status, headers=tuple(headers), body=b"")
        length = response.header(b"content-length")
        if status < 200 or status in (204, 304):
            body = b""
        elif response.header(b"transfer-encoding") is not None:
            decoded = _dechunk(after)
            if decoded is None:
                break
            body, after = decoded
        elif length is not None:
            if not length.isdigit() or len(after) < int(length):
                break
            body, after = after[: int(length)], after[int(length) :]
        else:
            body, after = after, b""
        out.append(attrs.evolve(response, body=body))
        rest = after
    return tuple(out), rest


def _dechunk(data: bytes) -> tuple[bytes, bytes] | None:
    body = b""
    while True:
        end = data.find(b"\r\n")
        if end < 0 or not re.fullmatch(rb"[0-9a-fA-F]{1,16}", data[:end]):
            return None
        size = int(data[:end], 16)
        data = data[end + 2 :]
        if size == 0:  # then trailer lines, up to a blank line
            if data.startswith(b"\r\n"):
                return body, data[2:]
            end = data.find(b"\r\n\r\n")
            return None if end < 0 else (body, data[end + 4 :])
        if len(data) < size + 2 or data[size : size + 2] != b"\r\n":
            return None
        body, data = body + data[:size], data[size + 2 :]


# --- what the raw bytes of a framed request say (what h11 normalises away) -------------------


def _head_lines(raw_head: bytes) -> list[bytes]:
    """The header lines (request line and blank line left out), LF-split, CR-stripped."""
    lines = [line.removesuffix(b"\r") for line in raw_head.split(b"\n")]
    return [line for line in lines[1:] if line]


def _fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    out = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            continue  # obs-fold: its own difference
        name, _, value = line.partition(b":")
        out.append((name.lower(), value.strip(b" \t")))
    return out


def _raw_fields(request: Framed) -> list[tuple[bytes, bytes]]:
    return _fields(_head_lines(request.raw_head))


@attrs.frozen(kw_only=True)
class _Chunks:
    size_lines: tuple[bytes, ...]  # each chunk-size line, without its CRLF
    trailer_section: bytes  # after the last chunk's line, with the blank line that ends it


def _chunks(request: Framed) -> _Chunks | None:
    """A chunked body's framing, walked as h11 walks it (a size line ends at CRLF)."""
    if not request.header(b"transfer-encoding"):
        return None
    raw, pos = request.raw_body, 0
    lines: list[bytes] = []
    while True:
        end = raw.find(b"\r\n", pos)
        if end < 0:
            return _Chunks(size_lines=tuple(lines), trailer_section=b"")
        line = raw[pos:end]
        lines.append(line)
        digits = re.match(rb"[0-9a-fA-F]*", line)
        assert digits is not None
        if not digits.group():
            return _Chunks(size_lines=tuple(lines), trailer_section=b"")
        size = int(digits.group(), 16)
        pos = end + 2
        if size == 0:
            return _Chunks(size_lines=tuple(lines), trailer_section=raw[pos:])
        pos += size + 2


def _trailer_lines(request: Framed) -> list[bytes]:
    chunks = _chunks(request)
    if chunks is None:
        return []
    return [line.removesuffix(b"\r") for line in chunks.trailer_section.split(b"\n") if line]


def _size_lines(request: Framed) -> tuple[bytes, ...]:
    chunks = _chunks(request)
    return () if chunks is None else chunks.size_lines


_BARE_LF = re.compile(rb"(?<!\r)\n")
_HEX = re.compile(rb"[0-9a-fA-F]+")
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"'
# RFC 9112 section 7.1.1 as llhttp reads it: no bad whitespace (BWS), but an empty name before
# ";" or "=", an empty value, and a token then a quoted string are taken (checked against llhttp
# over every extension of up to six bytes of ;="a, space, tab, backslash and comma).
_CHUNK_EXTENSIONS = re.compile(
    rb"(?:;(?:%b|(?=[;=]))(?:=(?:%b)?(?:%b)?)?)*" % (_TOKEN, _TOKEN, _QUOTED)
)
_CONTROL = re.compile(rb"[\x01-\x08\x0a-\x1f\x7f]")
# The methods llhttp parses in a request (its HTTP methods; RTSP's and PRI are not requests).
LLHTTP_METHODS = frozenset(
    b"DELETE GET HEAD POST PUT CONNECT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND PROPPATCH "
    b"SEARCH UNLOCK BIND REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE M-SEARCH NOTIFY "
    b"SUBSCRIBE UNSUBSCRIBE PATCH PURGE MKCALENDAR LINK UNLINK SOURCE QUERY".split()
)


_ABSOLUTE_FORM = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*://")


def has_cl_and_te(r: Framed) -> bool:
    names = {name for name, _ in _raw_fields(r)}
    return b"content-length" in names and b"transfer-encoding" in names


def repeats_content_length(r: Framed) -> bool:
    lengths = [value for name, value in _raw_fields(r) if name == b"content-length"]
    return len(lengths) > 1 or any(b"," in value for value in lengths)


def long_content_length(r: Framed) -> bool:
    return any(len(value) > 19 for name, value in _raw_fields(r) if name == b"content-length")


def folds_a_line(r: Framed) -> bool:
    lines = _head_lines(r.raw_head) + _trailer_lines(r)
    return any(line[:1] in (b" ", b"\t") for line in lines)


def bare_lf_line_end(r: Framed) -> bool:
    chunks = _chunks(r)
    trailers = b"" if chunks is None else chunks.trailer_section
    return bool(_BARE_LF.search(r.raw_head) or _BARE_LF.search(trailers))


def chunk_line_whitespace(r: Framed) -> bool:
    return any(line.endswith((b" ", b"\t")) for line in _size_lines(r))


def chunk_line_bare_cr(r: Framed) -> bool:
    return any(b"\r" in line for line in _size_lines(r))


def chunk_extension_malformed(r: Framed) -> bool:
    for line in _size_lines(r):
        digits = _HEX.match(line)
        rest = line[digits.end() :] if digits else line
        if not _CHUNK_EXTENSIONS.fullmatch(rest.rstrip(b" \t")):
            return True
    return False


def long_chunk_size(r: Framed) -> bool:
    return any((m := _HEX.match(line)) and len(m.group()) > 16 for line in _size_lines(r))


def te_on_http10(r: Framed) -> bool:
    return r.http_version == b"1.0" and any(n == b"transfer-encoding" for n, _ in r.headers)


def other_version(r: Framed) -> bool:
    return r.http_version not in (b"1.0", b"1.1")


def unknown_method(r: Framed) -> bool:
    return r.method not in LLHTTP_METHODS


def control_in_value(r: Framed) -> bool:
    values = [value for _, value in (*r.headers, *r.trailers)]
    return any(_CONTROL.search(value) for value in values)


def declares_over_limit(r: Framed) -> bool:
    lengths = r.header(b"content-length")
    return bool(lengths) and int(lengths[0]) > MAX_BODY_BYTES


def grows_over_limit(r: Framed) -> bool:
    return len(r.body) > MAX_BODY_BYTES


def target_in_no_form(r: Framed) -> bool:
    """Neither origin-form (``/...``), absolute-form (``scheme://...``) nor ``*``."""
    target = r.target
    return not (target.startswith(b"/") or target == b"*" or _ABSOLUTE_FORM.match(target))


@attrs.frozen(kw_only=True)
class Difference:
    """Requests h11 accepts and the gateway refuses, on purpose."""

    name: str
    applies: Callable[[Framed], bool]
    statuses: frozenset[int]
    reason: str
    no_continue: bool = False  # refused from the head: no 100 Continue before the answer


DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        name="content-length-with-transfer-encoding",
        applies=has_cl_and_te,
        statuses=frozenset({400}),
        reason="h11 frames by Transfer-Encoding and ignores Content-Length (RFC 9112 6.3 "
        "allows it); a proxy in front that frames by Content-Length reads another body: the "
        "classic CL.TE / TE.CL smuggling. Issue 26 refuses (llhttp strict does too).",
    ),
    Difference(
        name="repeated-content-length",
        applies=repeats_content_length,
        statuses=frozenset({400}),
        reason="h11 takes identical repeats (two 'Content-Length: 5' lines, or '5, 5') as one "
        "length (RFC 9110 8.6 lets it); issue 26 refuses any Content-Length that is not one "
        "plain number, as llhttp does.",
    ),
    Difference(
        name="content-length-over-19-digits",
        applies=long_content_length,
        statuses=frozenset({400, 413}),
        reason="h11 accepts up to 20 digits (leading zeros included); issue 26 bounds a "
        "Content-Length at 19 decimal digits, what a signed 64-bit length holds.",
    ),
    Difference(
        name="obs-fold",
        applies=folds_a_line,
        statuses=frozenset({400}),
        reason="h11 unfolds an obsolete line folding into the previous value; RFC 9112 5.2 "
        "lets a server refuse it, and a hop that does not unfold (or unfolds otherwise) sees "
        "other headers. Issue 26 refuses it, in the head and in trailers (llhttp strict too).",
    ),
    Difference(
        name="bare-lf-line-end",
        applies=bare_lf_line_end,
        statuses=frozenset({400}),
        reason="h11 takes a bare LF as a line end in the head and the trailers (RFC 9112 2.2 "
        "allows it); a hop that does not sees one line where we see two. llhttp strict "
        "refuses, and so does issue 26 in chunked framing.",
    ),
    Difference(
        name="chunk-line-whitespace",
        applies=chunk_line_whitespace,
        statuses=frozenset({400}),
        reason="h11 allows whitespace after a chunk size or its extensions, before the CRLF "
        "('some servers use it'); RFC 9112 7.1 has none, issue 26 and llhttp strict refuse.",
    ),
    Difference(
        name="chunk-line-bare-cr",
        applies=chunk_line_bare_cr,
        statuses=frozenset({400}),
        reason="h11's chunk extension is ';.*', which takes a bare CR; issue 26 refuses a bare "
        "CR anywhere in chunked framing.",
    ),
    Difference(
        name="chunk-extension-malformed",
        applies=chunk_extension_malformed,
        statuses=frozenset({400}),
        reason="h11 discards whatever follows ';' unread (NUL included); RFC 9112 7.1.1 gives "
        "chunk extensions a grammar (token[=token|quoted-string]) and llhttp checks it.",
    ),
    Difference(
        name="chunk-size-over-16-hex-digits",
        applies=long_chunk_size,
        statuses=frozenset({400}),
        reason="h11 accepts up to 20 hex digits (leading zeros included); issue 26 bounds a "
        "chunk size at 16 hex digits (64 bits).",
    ),
    Difference(
        name="transfer-encoding-on-http10",
        applies=te_on_http10,
        statuses=frozenset({400}),
        reason="h11 frames a chunked HTTP/1.0 body; RFC 9112 6.1 says such framing MUST be "
        "treated as faulty (an HTTP/1.0 hop does not know chunked). Issue 26 refuses it.",
    ),
    Difference(
        name="http-version-not-1.x",
        applies=other_version,
        statuses=frozenset({505}),
        reason="h11 takes any HTTP/d.d, HTTP/1.2 and 2.0 as 1.1, HTTP/0.9 as 1.0; the gateway "
        "speaks 1.0 and 1.1 only (505, RFC 9110 15.6.6).",
    ),
    Difference(
        name="method-llhttp-does-not-know",
        applies=unknown_method,
        statuses=frozenset({400, 501}),
        reason="h11 takes any token as a method (lower-case 'get' too); llhttp parses only "
        "the methods it registers.",
    ),
    Difference(
        name="control-character-in-a-value",
        applies=control_in_value,
        statuses=frozenset({400}),
        reason="h11 lets every control character but NUL and whitespace through a field "
        "value (cookies seen in the wild); RFC 9110 5.5 has none, llhttp strict and today's "
        "parser refuse them.",
    ),
    Difference(
        name="body-declared-over-the-limit",
        applies=declares_over_limit,
        statuses=frozenset({413}),
        reason="h11 has no body limit; the gateway refuses a Content-Length over "
        "max_body_bytes from the head, without a 100 Continue (issue 26).",
        no_continue=True,
    ),
    Difference(
        name="body-grown-over-the-limit",
        applies=grows_over_limit,
        statuses=frozenset({413}),
        reason="h11 has no body limit; the gateway refuses a chunked body once it passes "
        "max_body_bytes.",
    ),
    Difference(
        name="target-in-no-form",
        applies=target_in_no_form,
        statuses=frozenset({400}),
        reason="h11 takes any visible characters as a target; llhttp only RFC 9112's forms "
        "(origin, absolute, asterisk; authority only with CONNECT, which the gateway refuses). "
        "Found by the byte-level mutations (test_h1_mutations.py): `GET :/ HTTP/1.1`.",
    ),
)


# --- what the server should do, and whether it did ----------------------------------------------


@attrs.frozen(kw_only=True)
class Expectation:
    answered: tuple[Framed, ...]  # echoed, in order, as h11 framed them
    # close: the last answered says connection: close, then EOF. refuse: then one error
    # response (connection: close) and EOF. open: h11 waits for more; the server may close at
    # its timeout, with or without one error response.
    end: Literal["close", "refuse", "open"]
    statuses: frozenset[int]  # with end "refuse"
    no_continue: bool
    because: str

    def describe(self) -> str:
        n = len(self.answered)
        if self.end == "refuse":
            return f"answer {n}, refuse {'/'.join(map(str, sorted(self.statuses)))}"
        return f"answer {n}, {self.end}"


def reference(vector: Vector) -> Reference:
    return frame_with_h11(vector.data + SENTINEL, max_head_bytes=HEAD_BOUND)


def expect(ref: Reference) -> Expectation:
    for i, request in enumerate(ref.requests):
        hits = [d for d in DIFFERENCES if d.applies(request)]
        if i == ref.refused_at:
            break  # h11 refuses it itself (a head refused has no Framed at all)
        if hits:
            return Expectation(
                answered=ref.requests[:i],
                end="refuse",
                statuses=frozenset().union(*(d.statuses for d in hits)),
                no_continue=any(d.no_continue for d in hits),
                because="differs: " + ", ".join(d.name for d in hits),
            )
    else:
        hits = []
    if ref.verdict == "refused":
        return Expectation(
            answered=ref.complete,
            end="refuse",
            statuses=FRAMING_ERRORS,
            no_continue=any(d.no_continue for d in hits),
            because=f"h11: {ref.status_hint} {ref.error}",
        )
    return Expectation(
        answered=ref.complete,
        end="close" if ref.verdict == "closed" else "open",
        statuses=frozenset(),
        no_continue=False,
        because=f"h11: {ref.verdict}",
    )


def same_target(framed: bytes, seen: bytes) -> bool:
    """The echoed target is h11's; for an absolute-form one, its origin form will do too
    (ASGI's raw_path is the path only)."""
    if seen == framed:
        return True
    absolute = re.match(rb"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*", framed)
    return absolute is not None and seen == (framed[absolute.end() :] or b"/")


def echo_problem(request: Framed, response: Response) -> str | None:
    if response.status != 200:
        return f"status {response.status}"
    try:
        seen = json.loads(response.body)
    except ValueError:
        return f"not an echo: {response.body[:80]!r}"
    want = {
        "method": request.method.decode("latin-1"),
        "version": request.http_version.decode("latin-1"),
        "length": len(request.body),
        "sha256": hashlib.sha256(request.body).hexdigest(),
    }
    got = {key: seen.get(key) for key in want}
    if got != want:
        return f"echoed {got}, h11 framed {want}"
    if not same_target(request.target, str(seen.get("target")).encode("latin-1")):
        return f"target {seen.get('target')!r}, h11 framed {request.target!r}"
    return None


def judge(expectation: Expectation, conversation: Conversation) -> list[str]:
    """What the server did that the expectation does not allow (nothing: it agrees)."""
    problems: list[str] = []
    finals = conversation.finals
    answered = expectation.answered
    for i, request in enumerate(answered):
        if i >= len(finals):
            what = f"{request.method.decode('latin-1')} {request.target[:40].decode('latin-1')}"
            problems.append(f"request #{i} ({what}) not answered")
            break
        problem = echo_problem(request, finals[i])
        if problem is not None:
            problems.append(f"request #{i}: {problem}")
    extra = finals[len(answered) :]
    if expectation.end == "close" and extra:
        problems.append(f"{len(extra)} more answered than h11 framed")
    elif expectation.end == "refuse":
        if len(extra) != 1:
            problems.append(f"{len(extra)} responses where one refusal was due")
        elif extra[0].status not in expectation.statuses:
            problems.append(f"refused with {extra[0].status}")
    elif expectation.end == "open" and (len(extra) > 1 or (extra and extra[0].status < 400)):
        problems.append("answered more than h11 framed")
    for response in finals[:-1]:
        if response.closes:
            problems.append("went on after a response that said connection: close")
    if finals and expectation.end != "open" and not finals[-1].closes:
        problems.append(f"the last response ({finals[-1].status}) does not say connection: close")
    if extra and expectation.end == "open" and not extra[0].closes:
        problems.append(f"the error ({extra[0].status}) does not say connection: close")
    if expectation.no_continue:
        # After the answers to the requests before it, no 100 for the one refused.
        seen = 0
        for at, response in enumerate(conversation.responses):
            if seen == len(answered):
                if any(r.status == 100 for r in conversation.responses[at:]):
                    problems.append("a 100 Continue before the refusal of the body")
                break
            seen += response.status >= 200
    if conversation.ended == "timeout":
        problems.append(f"no end of the connection within {CONVERSATION_BOUND_S} s")
    if conversation.garbage:
        problems.append(f"not a response: {conversation.garbage[:60]!r}")
    return problems


# --- the test ------------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS, ids=[v.name for v in VECTORS])
async def test_the_front_frames_requests_as_h11_does(vector: Vector) -> None:
    expectation = expect(reference(vector))
    async with serving_strict() as port:
        conversation = await converse(port, vector)
    problems = judge(expectation, conversation)
    assert not problems, (
        f"{vector.name}: expected {expectation.describe()} ({expectation.because}); "
        f"the server gave {conversation.describe()}: " + "; ".join(problems)
    )


def test_every_difference_is_met_by_a_vector_h11_accepts() -> None:
    """No dead row in the table: each difference decides at least one vector's expectation."""
    met: set[str] = set()
    for vector in VECTORS:
        because = expect(reference(vector)).because
        if because.startswith("differs: "):
            met.update(because.removeprefix("differs: ").split(", "))
    assert met == {d.name for d in DIFFERENCES}


def test_responses_are_read_strictly() -> None:
    data = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"
        b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\ncontent-length: 1\r\n\r\nx"
        b"junk"
    )
    responses, garbage = parse_responses(data)
    assert [(r.status, r.body, r.closes) for r in responses] == [
        (100, b"", False),
        (200, b"ok", False),
        (200, b"abc", False),
        (400, b"x", True),
    ]
    assert garbage == b"junk"


# --- the summary, run directly ---------------------------------------------------------------


async def summary(only: list[str]) -> int:
    """Every vector (or those whose name holds one of ``only``): h11's verdict, what the test
    expects, the server's answers, and whether they agree. The number that disagree."""
    wrong = 0
    vectors = [v for v in VECTORS if not only or any(part in v.name for part in only)]
    for vector in vectors:
        ref = reference(vector)
        expectation = expect(ref)
        async with serving_strict() as port:
            conversation = await converse(port, vector)
        problems = judge(expectation, conversation)
        wrong += bool(problems)
        print(
            f"{'ok  ' if not problems else 'FAIL'} {vector.name:44} {vector.family:17} "
            f"h11: {ref.describe()[:60]:60} | expect: {expectation.describe():24} | "
            f"server: {conversation.describe()}"
        )
        for problem in problems:
            print(f"       {problem}")
    print(f"{wrong} of {len(vectors)} vectors disagree")
    return wrong


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.CRITICAL)  # today's server logs the tracebacks it meets
    sys.exit(1 if trio.run(summary, sys.argv[1:]) else 0)
