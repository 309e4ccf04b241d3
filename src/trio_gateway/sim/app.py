"""The ASGI app: routes, auth, and the two ways of answering a chat completion.

Everything that decides *what* to say lives in the pure modules; this file only moves bytes and
watches the client. Hypercorn never cancels an app whose client left (and `send()` keeps
"succeeding"), so every answer that waits on the engine runs next to a task watching `receive()`
for `http.disconnect`, which cancels the answer and so removes the sequence from the engine,
as vLLM does.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeAlias

import attrs
import trio

from . import errors
from .engine import SimEngine, SimSequence
from .errors import ApiError
from .request import parse_chat_request
from .script import Generation, ScriptError, plan_generation
from .wire import (
    VLLM_VERSION,
    ResponseContext,
    StreamRenderer,
    completion_body,
    dumps,
    metrics_text,
    models_body,
)

__all__ = ["SimApp"]

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
Handler: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 16 * 2**20  # 16 MiB: far above any prompt that fits max_model_len
# Pause between the two halves of an SSE event cut inside a UTF-8 character (script
# `split_utf8`), long enough for them to leave in separate TCP segments.
SPLIT_PAUSE_S = 0.005

_JSON = [(b"content-type", b"application/json")]
_SSE = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
_METRICS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


@attrs.define
class _Watch:
    client_left: bool = False


async def _send_bytes(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_json(send: Send, status: int, value: Any) -> None:
    await _send_bytes(send, status, _JSON, dumps(value))


async def _send_error(send: Send, error: ApiError) -> None:
    headers = _JSON + [(k.encode(), v.encode()) for k, v in error.headers]
    await _send_bytes(send, error.status, headers, dumps(error.body))


async def _read_body(receive: Receive) -> bytes | None:
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


class SimApp:
    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine
        self._config = engine.config
        self._created = int(time.time())
        # Stable per configuration, like vLLM's per-deployment fingerprint.
        digest = zlib.crc32(f"{self._config.model}|{self._config.served_model_name}".encode())
        self._fingerprint = f"vllm-{VLLM_VERSION}-{digest:08x}"
        self._routes: dict[str, tuple[str, Handler]] = {
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/models": ("GET", self._models),
            "/health": ("GET", self._health),
            "/load": ("GET", self._load),
            "/metrics": ("GET", self._metrics),
            "/sim/stats": ("GET", self._stats),
            "/sim/reset": ("POST", self._reset),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1000})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _authorized(self, scope: Scope) -> bool:
        key = self._config.api_key
        if key is None:
            return True
        expected = f"Bearer {key}".encode()
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                return hmac.compare_digest(value, expected)
        return False

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        # As vLLM's middleware: only /v1 needs the key; health, load and metrics are open.
        if path.startswith("/v1") and method != "OPTIONS" and not self._authorized(scope):
            await _send_error(send, errors.unauthorized())
            return
        route = self._routes.get(path)
        if route is None:
            await _send_error(send, errors.route_not_found())
        elif route[0] != method:
            await _send_error(send, errors.method_not_allowed())
        else:
            await route[1](scope, receive, send)

    # ---- small endpoints ----

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_bytes(send, 200, [(b"content-length", b"0")], b"")

    async def _load(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_json(send, 200, {"server_load": self._engine.server_load()})

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        config = self._config
        body = models_body(
            config.served_model_name, config.model, config.max_model_len, self._created
        )
        await _send_json(send, 200, body)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        stats = self._engine.stats()
        values: dict[str, float] = {
            "vllm:num_requests_running": stats.running,
            "vllm:num_requests_waiting": stats.waiting,
            "vllm:kv_cache_usage_perc": stats.kv_cache_usage,
            "vllm:prefix_cache_queries_total": stats.prefix_cache_queries,
            "vllm:prefix_cache_hits_total": stats.prefix_cache_hits,
            "vllm:prompt_tokens_total": stats.prompt_tokens,
            "vllm:generation_tokens_total": stats.tokens_generated,
        }
        for reason, count in stats.finished_by_reason.items():
            values[f"success:{reason}"] = count
        text = metrics_text(self._config.served_model_name, values)
        await _send_bytes(send, 200, _METRICS, text.encode())

    async def _stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_json(send, 200, self._engine.stats().to_json())

    async def _reset(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._engine.reset()
        await _send_json(send, 200, {"reset": True})

    # ---- chat completions ----

    def _record(self, scope: Scope, body: bytes) -> None:
        try:
            recorded: Any = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            recorded = body[:1000].decode("utf-8", "replace")
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", ())
        }
        if "authorization" in headers:
            headers["authorization"] = "<redacted>"
        self._engine.note_request(recorded, headers)

    async def _refuse(self, send: Send, error: ApiError) -> None:
        self._engine.note_error()
        await _send_error(send, error)

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        if body is None:
            return
        self._record(scope, body)
        request = parse_chat_request(body, self._config)
        if isinstance(request, ApiError):
            await self._refuse(send, request)
            return
        try:
            generation = plan_generation(request, self._config)
        except ScriptError as error:
            await self._refuse(send, errors.script_error(str(error)))
            return
        fault = generation.fault
        if fault is not None and self._engine.fault_applies(generation.script_key, fault.times):
            await trio.sleep(generation.fault_delay_s)
            refusal = errors.simulated_fault(fault.status, fault.body, fault.retry_after)
            await self._refuse(send, refusal)
            return
        ctx = ResponseContext(
            response_id=f"chatcmpl-{secrets.token_hex(8)}",
            created=int(time.time()),
            model=self._config.served_model_name,
            system_fingerprint=self._fingerprint,
            prompt_tokens=request.prompt.tokens,
            tool_call_ids=tuple(
                f"chatcmpl-tool-{secrets.token_hex(8)}" for _ in range(generation.tool_calls)
            ),
            include_usage=request.include_usage,
            continuous_usage=request.continuous_usage,
        )
        with self._engine.sequence(
            prompt_tokens=request.prompt.tokens,
            block_hashes=request.prompt.block_hashes,
            n_tokens=len(generation.tokens),
            delays={i: t.delay_s for i, t in enumerate(generation.tokens) if t.delay_s},
            finish_reason=generation.finish_reason,
        ) as seq:
            if request.stream:
                await self._stream(receive, send, seq, generation, ctx)
            else:
                await self._complete(receive, send, seq, generation, ctx)

    async def _watch(
        self, receive: Receive, seq: SimSequence, watch: _Watch, scope: trio.CancelScope
    ) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                watch.client_left = True
                seq.mark_client_left()
                if self._config.abort_on_disconnect:
                    scope.cancel()
                return

    async def _send_event(self, send: Send, event: bytes, split_utf8: bool) -> None:
        cut = _utf8_cut(event) if split_utf8 else None
        if cut is not None:
            await send({"type": "http.response.body", "body": event[:cut], "more_body": True})
            await trio.sleep(SPLIT_PAUSE_S)
            event = event[cut:]
        await send({"type": "http.response.body", "body": event, "more_body": True})

    async def _stream(
        self,
        receive: Receive,
        send: Send,
        seq: SimSequence,
        generation: Generation,
        ctx: ResponseContext,
    ) -> None:
        # Headers go out at once, as with vLLM: a 200 says nothing about the queue behind it.
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        renderer = StreamRenderer(ctx, generation)
        watch = _Watch()
        complete = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch, receive, seq, watch, nursery.cancel_scope)
            sent = 0
            while sent != generation.drop_after:
                index = await seq.next_token()
                if index is None:
                    complete = True
                    break
                if not watch.client_left:
                    for event in renderer.token(index):
                        await self._send_event(send, event, generation.split_utf8)
                sent = index + 1
            # Stop watching before the final send: hypercorn reports the normal end of the
            # response as an `http.disconnect` too.
            nursery.cancel_scope.cancel()
        if complete and not watch.client_left:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        # Otherwise return with the body unfinished: hypercorn closes the connection, which
        # is exactly what a scripted `drop` wants the client to see.

    async def _complete(
        self,
        receive: Receive,
        send: Send,
        seq: SimSequence,
        generation: Generation,
        ctx: ResponseContext,
    ) -> None:
        watch = _Watch()
        produced = 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch, receive, seq, watch, nursery.cancel_scope)
            while produced != generation.drop_after:
                index = await seq.next_token()
                if index is None:
                    break
                produced = index + 1
            nursery.cancel_scope.cancel()
        if watch.client_left:
            return
        body = dumps(completion_body(ctx, generation, produced))
        if generation.drop_after is None:
            await _send_bytes(send, 200, _JSON, body)
            return
        # A scripted drop: promise the whole body, deliver half, close the connection.
        headers = [*_JSON, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        half = body[: len(body) // 2]
        await send({"type": "http.response.body", "body": half, "more_body": True})
