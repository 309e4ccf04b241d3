"""A minimal HTTP/1.1 client on raw trio sockets: the load generator of scenarios A, B, D and E.

Why not httpx: the load generator must not be the bottleneck. At 5,000 chunks/s (B, D) or
thousands of requests/s (A), httpx's per-chunk and per-request cost in the benchmark process
would compete with the servers measured for the same 2 cores. This client does only what the
benchmarks need: one request per connection at a time (keep-alive for A), a chunked or
``content-length`` body, SSE events split on blank lines, each parsed with ``json.loads``. It also
gives the slow clients of scenario E what httpx cannot: a small ``SO_RCVBUF`` set before connect
and reads of a few hundred bytes at a chosen pace.

Failures are classified by kind (``connect_refused``, ``connect_timeout``, ``reset``,
``eof``, ``http_503:overloaded``, ``in_stream:upstream_unreachable``, ...), so a table can say
what went wrong, not only how often.
"""

from __future__ import annotations

import errno
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

MAX_HEAD_BYTES = 65536
READ_BYTES = 65536


class RequestFailed(Exception):
    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail


def _os_kind(prefix: str, exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return f"{prefix}refused"
    if isinstance(exc, ConnectionResetError):
        return f"{prefix}reset"
    name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return f"{prefix}{name}"


async def connect(
    host: str, port: int, *, timeout_s: float, rcvbuf: int | None = None
) -> trio.SocketStream:
    """A connected socket; ``rcvbuf`` is set before connecting, so the TCP window is small from
    the handshake on (Linux doubles the value and applies a floor of a few KiB)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with trio.fail_after(timeout_s):
            await sock.connect((host, port))
    except trio.TooSlowError:
        sock.close()
        raise RequestFailed("connect_timeout") from None
    except OSError as exc:
        sock.close()
        raise RequestFailed(_os_kind("connect_", exc), str(exc)) from None
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def post_bytes(host: str, port: int, path: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


class Response:
    """Reads one response from a stream: the head, then the body piece by piece (chunked,
    ``content-length`` or until close). Keeps leftover bytes for nothing: one response per
    ``Response`` and, for keep-alive, the server sends nothing unasked."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buf = bytearray()
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunked = False
        self._remaining: int | None = None  # content-length left
        self._done = False

    async def _fill(self) -> bool:
        try:
            data = await self._stream.receive_some(READ_BYTES)
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__
            raise RequestFailed(
                _os_kind("", cause) if isinstance(cause, OSError) else "broken"
            ) from None
        except OSError as exc:
            raise RequestFailed(_os_kind("", exc)) from None
        if not data:
            return False
        self._buf += data
        return True

    async def read_head(self) -> None:
        while (end := self._buf.find(b"\r\n\r\n")) < 0:
            if len(self._buf) > MAX_HEAD_BYTES:
                raise RequestFailed("bad_head", "too long")
            if not await self._fill():
                raise RequestFailed("eof", "before the response head")
        lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
        del self._buf[: end + 4]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise RequestFailed("bad_head", lines[0][:100])
        self.status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        if not self._chunked and "content-length" in self.headers:
            self._remaining = int(self.headers["content-length"])

    async def next_piece(self) -> bytes | None:
        """The next piece of the body as it arrived (dechunked), None at its end."""
        if self._done:
            return None
        if self._chunked:
            return await self._next_chunk()
        if self._remaining is not None:
            if self._remaining == 0:
                self._done = True
                return None
            if not self._buf and not await self._fill():
                raise RequestFailed("eof", "inside the body")
            piece = bytes(self._buf[: self._remaining])
            del self._buf[: len(piece)]
            self._remaining -= len(piece)
            return piece
        if not self._buf and not await self._fill():
            self._done = True
            return None
        piece = bytes(self._buf)
        self._buf.clear()
        return piece

    async def _next_chunk(self) -> bytes | None:
        # Every chunk whose bytes are already here, joined: one piece per network read.
        out = bytearray()
        while True:
            line_end = self._buf.find(b"\r\n")
            if line_end >= 0:
                size = int(bytes(self._buf[:line_end]).split(b";")[0], 16)
                if size == 0:
                    if self._buf.find(b"\r\n\r\n", line_end) < 0 and not out:
                        if not await self._fill():
                            raise RequestFailed("eof", "in the last chunk")
                        continue
                    self._done = True
                    return bytes(out) if out else None
                if len(self._buf) >= line_end + 2 + size + 2:
                    out += self._buf[line_end + 2 : line_end + 2 + size]
                    del self._buf[: line_end + 2 + size + 2]
                    continue
            if out:
                return bytes(out)
            if not await self._fill():
                raise RequestFailed("eof", "inside a chunk")

    async def read_body(self) -> bytes:
        body = bytearray()
        while (piece := await self.next_piece()) is not None:
            body += piece
        return bytes(body)


def error_code(body: bytes) -> str:
    """The ``error.code`` (or ``type``) of an OpenAI-shaped error body, else "?"."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return "?"
    if isinstance(error, dict):
        return str(error.get("code") or error.get("type") or "?")
    return str(error) if error else "?"


@attrs.define
class StreamResult:
    """One streamed answer, timed by the client (time.monotonic(), seconds)."""

    index: int
    started: float = 0.0  # just before connecting
    connect_s: float | None = None  # started → connected
    ttft_s: float | None = None  # started → first non-empty delta.content
    end_s: float | None = None  # started → end (complete, failed or left)
    tokens: int = 0  # content chunks
    events: int = 0  # SSE data events, [DONE] included: the chunks relayed
    gaps_s: list[float] = attrs.Factory(list)  # between consecutive content chunks
    gap_ends: list[float] = attrs.Factory(list)  # time.monotonic() at the end of each gap
    finish_reason: str | None = None
    done: bool = False  # saw data: [DONE]
    left_at: float | None = None  # time.monotonic() when this client closed on purpose
    error: str | None = None  # failure kind
    detail: str | None = None


async def stream_chat(
    result: StreamResult,
    host: str,
    port: int,
    request: bytes,
    *,
    connect_timeout_s: float,
    leave_after: int | None = None,
    on_first_token: Callable[[], None] | None = None,
) -> None:
    """POST a streamed chat request and read it to the end, filling ``result``. A client with
    ``leave_after`` closes its connection after that many content chunks. Cancelling the
    caller's scope makes the client leave (``left_at`` is set as the socket closes)."""
    result.started = time.monotonic()
    last: float | None = None
    stream: trio.SocketStream | None = None
    try:
        stream = await connect(host, port, timeout_s=connect_timeout_s)
        result.connect_s = time.monotonic() - result.started
        await stream.send_all(request)
        response = Response(stream)
        await response.read_head()
        if response.status != 200:
            body = await response.read_body()
            raise RequestFailed(f"http_{response.status}:{error_code(body)}", body[:300].decode())
        pending = b""
        while (piece := await response.next_piece()) is not None:
            now = time.monotonic()
            pending += piece
            *events, pending = pending.split(b"\n\n")
            for event in events:
                data = event.removeprefix(b"data: ")
                if data is event:
                    continue  # a comment or another field
                result.events += 1
                if data == b"[DONE]":
                    result.done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk["error"]
                    code = error.get("code", "?") if isinstance(error, dict) else error
                    raise RequestFailed(f"in_stream:{code}", json.dumps(error)[:300])
                for choice in chunk.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        if result.ttft_s is None:
                            result.ttft_s = now - result.started
                            if on_first_token is not None:
                                on_first_token()
                        else:
                            assert last is not None
                            result.gaps_s.append(now - last)
                            result.gap_ends.append(now)
                        last = now
                        result.tokens += 1
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
                if leave_after is not None and result.tokens >= leave_after:
                    result.left_at = time.monotonic()
                    return
        if not result.done:
            raise RequestFailed("incomplete", "no [DONE]")
    except RequestFailed as exc:
        result.error, result.detail = exc.kind, exc.detail
    except ValueError as exc:
        result.error, result.detail = "bad_json", str(exc)[:200]
    except trio.Cancelled:
        if result.left_at is None:
            result.left_at = time.monotonic()
        raise
    finally:
        if stream is not None:
            # A cancelled aclose still closes the socket: the peer sees the FIN at once.
            with trio.CancelScope(shield=True):
                await stream.aclose()
        result.end_s = time.monotonic() - result.started
