"""The deliberate differences of the differential test: requests h11 accepts and the gateway
refuses on purpose, each with its reason, and what in a framed request's raw bytes (what h11
normalises away) shows that one applies. Where the server is more lenient than h11 there is no
row here: the test fails."""

from __future__ import annotations

import re
from collections.abc import Callable

import attrs

from tests.h1_reference import Framed
from tests.h1_vectors import MAX_BODY_BYTES

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
