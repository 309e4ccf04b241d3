"""The I/O every dialect shares: reading bodies, sending answers, and running a sequence while
watching the client.

Hypercorn never cancels an app whose client left (and `send()` keeps "succeeding"), so every
answer that waits on the engine runs next to a task watching `receive()` for
`http.disconnect`, which cancels the answer and so removes the sequence from the engine, as
vLLM does. The dialects differ only in the pure renderers they hand to `Shell.stream`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, Protocol, TypeAlias

import attrs
import trio

from trio_gateway.http1.server import HANG_UP_EXTENSION, SOCKET_FD_EXTENSION

from .engine import SimEngine, SimSequence
from .errors import ApiError
from .request import ChatRequest
from .script import Fault, Generation
from .wire import dumps

__all__ = [
    "JSON_HEADERS",
    "MAX_BODY_BYTES",
    "Receive",
    "Renderer",
    "Scope",
    "Send",
    "Shell",
    "header",
    "read_body",
    "send_bytes",
    "send_error",
    "send_json",
]

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 16 * 2**20  # 16 MiB: far above any prompt that fits max_model_len
# Pause between the two halves of an SSE event cut inside a UTF-8 character (script
# `split_utf8`), long enough for them to leave in separate TCP segments.
SPLIT_PAUSE_S = 0.005
# A sequence whose answer the script cuts short (drop, in-stream error) pauses this long
# before the first token it would never send, so the handler's leaving always finds it in
# the engine and counts an abort, however fast the engine runs.
HOLD_S = 24 * 3600.0
# Request headers kept for `SimStats.last_request_headers` are few; a longer value is cut.
MAX_RECORDED_HEADER_CHARS = 1000

JSON_HEADERS = [(b"content-type", b"application/json")]
_REDACTED = ("authorization", "x-api-key", "x-goog-api-key")


class Renderer(Protocol):
    """A dialect's pure stream encoder: feed token indexes 0, 1, ... in order."""

    def token(self, index: int, cached_tokens: int = 0) -> list[bytes]: ...

    def stream_error(self, fault: Fault) -> list[bytes]:
        """The events of an error after the stream began; the body then ends."""
        ...


@attrs.define
class _Watch:
    client_left: bool = False
    done: bool = False  # the answer is over: a hang-up now is no abort


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


async def send_bytes(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, value: Any) -> None:
    await send_bytes(send, status, JSON_HEADERS, dumps(value))


async def send_error(send: Send, error: ApiError) -> None:
    headers = JSON_HEADERS + [(k.encode(), v.encode()) for k, v in error.headers]
    await send_bytes(send, error.status, headers, dumps(error.body))


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, None if the client left first. Past MAX_BODY_BYTES the body
    is replaced by b"", which then fails as invalid JSON, the way an unreadable body would."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= MAX_BODY_BYTES:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks) if size <= MAX_BODY_BYTES else b""


def _utf8_cut(event: bytes) -> int | None:
    """An offset inside the first multi-byte character of `event`, if it has one."""
    for i, byte in enumerate(event):
        if byte >= 0xC0:
            return i + 1
    return None


class Shell:
    """Moves one answer's bytes for any dialect; owns no state beyond the engine's."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.config = engine.config

    def record(self, scope: Scope, body: bytes) -> None:
        try:
            recorded: Any = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            recorded = body[:1000].decode("utf-8", "replace")
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")[:MAX_RECORDED_HEADER_CHARS]
            for name, value in scope.get("headers", ())
        }
        for name in _REDACTED:
            if name in headers:
                headers[name] = "<redacted>"
        self.engine.note_request(recorded, headers)

    @contextmanager
    def sequence(self, request: ChatRequest, generation: Generation) -> Iterator[SimSequence]:
        delays = {i: t.delay_s for i, t in enumerate(generation.tokens) if t.delay_s}
        if generation.stop_after is not None:
            delays[generation.stop_after] = HOLD_S
        with self.engine.sequence(
            prompt_tokens=request.prompt.tokens,
            block_hashes=request.prompt.block_hashes,
            n_tokens=len(generation.tokens),
            delays=delays,
            finish_reason=generation.finish_reason,
            priority=request.priority,
        ) as seq:
            yield seq

    async def refuse(self, send: Send, error: ApiError) -> None:
        self.engine.note_error()
        await send_error(send, error)

    async def _watch(
        self,
        receive: Receive,
        seqs: Sequence[SimSequence],
        watch: _Watch,
        scope: trio.CancelScope,
    ) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not watch.client_left:  # the hang-up watch may have been first
                    watch.client_left = True
                    for seq in seqs:
                        seq.mark_client_left()
                    if self.config.abort_on_disconnect:
                        scope.cancel()
                return

    def _watch_hang_up(
        self,
        scope: Scope,
        seqs: Sequence[SimSequence],
        watch: _Watch,
        cancel: trio.CancelScope,
    ) -> Callable[[], None] | None:
        """Where the server keeps a hang-up watch (``http1.hang_ups.HangUps``), the client's leaving
        is acted on at once, from whichever task looks: the watcher task would run only after a
        burst of thousands of tokens (one turn of trio's loop). Returns how to stop; None where
        there is no such watch (the watcher task is there either way)."""
        extensions = scope.get("extensions") or {}
        hang_ups, fd = extensions.get(HANG_UP_EXTENSION), extensions.get(SOCKET_FD_EXTENSION)
        if hang_ups is None or fd is None:
            return None

        def gone() -> None:
            if not watch.client_left and not watch.done:
                watch.client_left = True
                for seq in seqs:
                    seq.mark_client_left()
                if self.config.abort_on_disconnect:
                    cancel.cancel()

        hang_ups.watch(fd, gone)
        return partial(hang_ups.unwatch, fd, gone)

    async def _send_event(self, send: Send, event: bytes, split_utf8: bool) -> None:
        cut = _utf8_cut(event) if split_utf8 else None
        if cut is not None:
            await send({"type": "http.response.body", "body": event[:cut], "more_body": True})
            await trio.sleep(SPLIT_PAUSE_S)
            event = event[cut:]
        await send({"type": "http.response.body", "body": event, "more_body": True})

    async def stream(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        seq: SimSequence,
        generation: Generation,
        renderer: Renderer,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        await self.stream_parts(scope, receive, send, [(seq, generation, renderer)], headers)

    async def stream_parts(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        parts: Sequence[tuple[SimSequence, Generation, Renderer]],
        headers: list[tuple[bytes, bytes]],
        tail: Callable[[], list[bytes]] | None = None,
    ) -> None:
        """Stream the sequences of one answer (a completion of several prompts has one each)
        one after the other, then ``tail``'s events; the engine runs them all at once."""
        # Headers go out at once, as vLLM and the clouds do: a 200 says nothing about the
        # queue behind it.
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        watch = _Watch()
        complete = False
        unwatch: Callable[[], None] | None = None
        seqs = [seq for seq, _, _ in parts]
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, receive, seqs, watch, nursery.cancel_scope)
                unwatch = self._watch_hang_up(scope, seqs, watch, nursery.cancel_scope)
                ended = "whole"
                for seq, generation, renderer in parts:
                    ended = await self._stream_one(send, seq, generation, renderer, watch)
                    if ended != "whole":
                        break
                # An in-stream error ends the body properly, with its own last events.
                complete = ended != "cut"
                if ended == "whole" and tail is not None and not watch.client_left:
                    for event in tail():
                        await self._send_event(send, event, False)
                # Stop watching before the final send: hypercorn reports the normal end of the
                # response as an `http.disconnect` too.
                watch.done = True
                nursery.cancel_scope.cancel()
        finally:
            if unwatch is not None:
                unwatch()
        if complete and not watch.client_left:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        # Otherwise return with the body unfinished: hypercorn closes the connection, which
        # is exactly what a scripted `drop` wants the client to see.

    async def _stream_one(
        self,
        send: Send,
        seq: SimSequence,
        generation: Generation,
        renderer: Renderer,
        watch: _Watch,
    ) -> str:
        """One sequence's events; how it ended: "whole", "failed" (a scripted in-stream error,
        sent) or "cut" (by the script: the body ends without a proper end)."""
        complete = False
        stop_after = generation.stop_after
        sent = 0
        while sent != stop_after:
            index = await seq.next_token()
            if index is None:
                complete = True
                break
            if not watch.client_left:
                for event in renderer.token(index, seq.cached_tokens):
                    await self._send_event(send, event, generation.split_utf8)
            sent = index + 1
        fault = generation.stream_fault
        if not complete and fault is not None and sent == generation.fault_after:
            await trio.sleep(generation.fault_delay_s)
            if not watch.client_left:
                self.engine.note_error()
                for event in renderer.stream_error(fault):
                    await self._send_event(send, event, False)
            return "failed"
        return "whole" if complete else "cut"

    async def generate(
        self, scope: Scope, receive: Receive, seq: SimSequence, generation: Generation
    ) -> int | None:
        """Run a non-stream answer's sequence: the tokens produced (fewer when the script cuts
        the answer short), None if the client left."""
        watch = _Watch()
        produced = 0
        stop_after = generation.stop_after
        unwatch: Callable[[], None] | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, receive, [seq], watch, nursery.cancel_scope)
                unwatch = self._watch_hang_up(scope, [seq], watch, nursery.cancel_scope)
                while produced != stop_after:
                    index = await seq.next_token()
                    if index is None:
                        break
                    produced = index + 1
                if generation.stream_fault is not None and produced == generation.fault_after:
                    await trio.sleep(generation.fault_delay_s)
                watch.done = True
                nursery.cancel_scope.cancel()
        finally:
            if unwatch is not None:
                unwatch()
        return None if watch.client_left else produced

    async def answer(
        self,
        send: Send,
        generation: Generation,
        produced: int,
        body: bytes,
        fault_error: Callable[[Fault], ApiError],
    ) -> None:
        """Send a non-stream answer: `body`, or the dialect's error when the script failed it
        midway, or half of `body` and a closed connection for a scripted drop."""
        fault = generation.stream_fault
        if fault is not None and produced == generation.fault_after:
            await self.refuse(send, fault_error(fault))
            return
        if generation.drop_after is None or produced != generation.drop_after:
            await send_bytes(send, 200, JSON_HEADERS, body)
            return
        # A scripted drop: promise the whole body, deliver half, close the connection.
        headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        half = body[: len(body) // 2]
        await send({"type": "http.response.body", "body": half, "more_body": True})
