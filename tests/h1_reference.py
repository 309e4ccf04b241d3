"""The reference for the differential test of the HTTP/1.x front: what h11 frames from a
client's bytes, driven as a server drives it.

``frame_with_h11(data, max_head_bytes=...)`` feeds the bytes to an ``h11.Connection(SERVER)``
and, after each request's ``EndOfMessage``, answers it (a minimal response) and starts the next
cycle, until one of:

- a request after which the connection must close (``Connection: close``, HTTP/1.0 without
  keep-alive): h11's ``MUST_CLOSE``; the bytes after it are never read (verdict ``closed``);
- h11 refuses (``RemoteProtocolError``, with its ``error_status_hint``): verdict ``refused``,
  at the request whose head or body it could not frame;
- the bytes end in the middle of a request (verdict ``incomplete``).

Three choices make h11 model a streaming server rather than a parser given everything at once:

- The bytes go in pieces that never let h11's buffer hold more than ``max_head_bytes + 1``
  bytes, so ``max_incomplete_event_size`` bounds each head and each trailer section exactly
  as if the bytes came one at a time (given all at once, h11 would take a head of any size
  that ends within them). A head is refused once more than ``max_head_bytes`` of it are read
  without its end.
- HTTP/1.0 keep-alive: h11 does not implement it (it closes after every HTTP/1.0 request);
  RFC 9112 section 9.3 and the gateway do. After an HTTP/1.0 request whose ``Connection``
  asks for keep-alive (and not for close), a fresh h11 connection frames what follows. The
  framing is h11's throughout; only the connection's lifetime is RFC 9112's.
- Each framed request keeps its raw bytes (head, and body framing), so the test's deliberate
  differences can look at what h11 normalises away (obs-fold, duplicate Content-Length, bare
  LF line ends, whitespace in chunk-size lines).
"""

from __future__ import annotations

from typing import Literal

import attrs
import h11

Verdict = Literal["closed", "refused", "incomplete"]


@attrs.frozen(kw_only=True)
class Framed:
    """One request as h11 framed it (``complete`` once its body ended too)."""

    method: bytes
    target: bytes
    http_version: bytes  # b"1.1", b"1.0", or what the request line said (b"1.2", b"2.0")
    headers: tuple[tuple[bytes, bytes], ...]  # h11's: names lower-cased, values stripped
    body: bytes
    complete: bool
    raw_head: bytes  # as read: the request line to the blank line, included
    # The body's framing as read (chunk lines, trailers); for a request h11 did not finish, all
    # it was given after the head.
    raw_body: bytes
    trailers: tuple[tuple[bytes, bytes], ...] = ()

    def header(self, name: bytes) -> list[bytes]:
        return [value for key, value in self.headers if key == name]


@attrs.frozen(kw_only=True)
class Reference:
    requests: tuple[Framed, ...]  # in order; a refused or unfinished one last, not complete
    verdict: Verdict
    # With verdict "refused": the index (in ``requests``, or len(requests) when even its head
    # was refused) of the request h11 refused, its status hint and its message.
    refused_at: int | None = None
    status_hint: int | None = None
    error: str | None = None

    @property
    def complete(self) -> tuple[Framed, ...]:
        return tuple(r for r in self.requests if r.complete)

    def describe(self) -> str:
        n = len(self.complete)
        if self.verdict == "refused":
            return f"{n} framed, refused #{self.refused_at} ({self.status_hint}: {self.error})"
        return f"{n} framed, {self.verdict}"


class Unsupported(Exception):
    """A vector this model cannot judge (an upgrade, CONNECT)."""


def frame_with_h11(
    data: bytes, *, max_head_bytes: int, piece_bytes: int | None = None
) -> Reference:
    """The requests h11 frames from ``data``, in order, and how the conversation ends.
    ``piece_bytes`` feeds h11 at most that many bytes at a time (the verdict is the same)."""
    requests: list[Framed] = []
    outcome: Reference | int = 0
    while isinstance(outcome, int):
        # An HTTP/1.0 keep-alive request ended: a fresh h11 reads what follows it.
        outcome = _one_connection(data, outcome, max_head_bytes, piece_bytes, requests)
    return outcome


def _one_connection(
    data: bytes, start: int, max_head_bytes: int, piece_bytes: int | None, requests: list[Framed]
) -> Reference | int:
    """Frames from ``data[start:]`` on one h11 connection, appending to ``requests``: how the
    conversation ended, or where an HTTP/1.0 keep-alive request ended."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head_bytes)
    fed = start  # bytes of ``data`` given to h11 so far

    def consumed() -> int:
        return fed - len(conn.trailing_data[0])

    request: h11.Request | None = None
    head_at = body_at = start
    body = bytearray()

    def framed(*, complete: bool, trailers: tuple[tuple[bytes, bytes], ...] = ()) -> Framed:
        assert request is not None
        end = consumed() if complete else fed
        return Framed(
            method=bytes(request.method),
            target=bytes(request.target),
            http_version=bytes(request.http_version),
            headers=tuple((bytes(k), bytes(v)) for k, v in request.headers),
            body=bytes(body),
            complete=complete,
            raw_head=data[head_at:body_at],
            raw_body=data[body_at:end],
            trailers=trailers,
        )

    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            at = len(requests)
            if request is not None:
                requests.append(framed(complete=False))
            return Reference(
                requests=tuple(requests),
                verdict="refused",
                refused_at=at,
                status_hint=exc.error_status_hint,
                error=str(exc),
            )
        if event is h11.NEED_DATA:
            if fed == len(data):
                if request is not None:
                    requests.append(framed(complete=False))
                return Reference(requests=tuple(requests), verdict="incomplete")
            # Never more than max_head_bytes + 1 bytes in h11's buffer: see the module's doc.
            room = max(1, max_head_bytes + 1 - len(conn.trailing_data[0]))
            room = min(room, piece_bytes or room)
            conn.receive_data(data[fed : fed + room])
            fed = min(len(data), fed + room)
            continue
        if event is h11.PAUSED:
            raise Unsupported("h11 paused mid-conversation (an upgrade or CONNECT?)")
        if isinstance(event, h11.Request):
            if event.method == b"CONNECT" or any(k == b"upgrade" for k, _ in event.headers):
                raise Unsupported("upgrades and CONNECT are handed off, not framed")
            request = event
            body_at = consumed()
            body = bytearray()
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            trailers = tuple((bytes(k), bytes(v)) for k, v in event.headers)
            requests.append(framed(complete=True, trailers=trailers))
            assert request is not None
            keep_alive_10 = request.http_version == b"1.0" and _asks_keep_alive(request)
            conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
            conn.send(h11.EndOfMessage())
            if conn.our_state is h11.MUST_CLOSE:
                if keep_alive_10:
                    return consumed()
                return Reference(requests=tuple(requests), verdict="closed")
            conn.start_next_cycle()
            request = None
            head_at = body_at = consumed()
        else:
            raise AssertionError(f"unexpected h11 event {event!r}")


def _asks_keep_alive(request: h11.Request) -> bool:
    tokens = {
        token.strip().lower()
        for name, value in request.headers
        if name == b"connection"
        for token in value.split(b",")
    }
    return b"keep-alive" in tokens and b"close" not in tokens
