"""The differential test's server and its conversations on the wire: the gateway's HTTP/1.x
server on a free port with an app that echoes each request, a vector written to a fresh
connection followed by the sentinel, and the responses read back strictly."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal

import attrs
import trio
import trio.testing

from tests.h1_vectors import MAX_BODY_BYTES, Vector
from trio_gateway.http1.server import H1Server

SENTINEL = b"GET /__end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
# The server's timeouts: a vector h11 leaves unfinished (a body still to come) ends at them.
SERVER_TIMEOUT_S = 1.0
# A conversation's bound: the server has closed by then, or the vector fails.
CONVERSATION_BOUND_S = 4.0


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
