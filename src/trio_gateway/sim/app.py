"""The ASGI app: routes by dialect, auth, and the vLLM/OpenAI chat completion.

Everything that decides *what* to say lives in the pure modules, and the shared I/O (reading,
answering, watching the client) in `shell.py`. The Anthropic and Gemini dialects have their
own handlers (`app_anthropic.py`, `app_gemini.py`); this file only picks one.
"""

from __future__ import annotations

import hmac
import secrets
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import TypeAlias
from urllib.parse import parse_qs

import trio

from . import errors, openai_wire
from .app_anthropic import AnthropicHandler
from .app_endpoints import EndpointsHandler
from .app_gemini import GeminiHandler
from .engine import SimEngine
from .errors import ApiError
from .request import parse_chat_request
from .script import Fault, ScriptError, plan_generation
from .shell import (
    Receive,
    Scope,
    Send,
    Shell,
    header,
    read_body,
    send_bytes,
    send_error,
    send_json,
)
from .wire import (
    VLLM_VERSION,
    ResponseContext,
    StreamRenderer,
    completion_body,
    dumps,
    metrics_text,
    models_body,
    vllm_fault_body,
)

__all__ = ["SimApp"]

Handler: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]

_SSE = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
_METRICS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


class SimApp:
    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine
        self._config = engine.config
        self._shell = Shell(engine)
        self._created = int(time.time())
        # Stable per configuration, like vLLM's per-deployment fingerprint.
        digest = zlib.crc32(f"{self._config.model}|{self._config.served_model_name}".encode())
        self._fingerprint = (
            f"fp_{digest:08x}"
            if self._config.dialect == "openai"
            else f"vllm-{VLLM_VERSION}-{digest:08x}"
        )
        self._routes: dict[str, tuple[str, Handler]] = {
            "/health": ("GET", self._health),
            "/load": ("GET", self._load),
            "/metrics": ("GET", self._metrics),
            "/sim/stats": ("GET", self._stats),
            "/sim/reset": ("POST", self._reset),
        }
        self._anthropic: AnthropicHandler | None = None
        self._gemini: GeminiHandler | None = None
        dialect = self._config.dialect
        if dialect in ("vllm", "openai"):
            endpoints = EndpointsHandler(self._shell, self._fingerprint)
            # vLLM registers the routes of what its model does: generate, or embed (pooling).
            pooling = dialect == "vllm" and self._config.runner == "pooling"
            if not pooling:
                self._routes["/v1/chat/completions"] = ("POST", self._chat)
                self._routes["/v1/completions"] = ("POST", endpoints.completions)
            if pooling or dialect == "openai":
                self._routes["/v1/embeddings"] = ("POST", endpoints.embeddings)
            self._routes["/v1/models"] = ("GET", self._models)
        elif dialect == "anthropic":
            self._anthropic = AnthropicHandler(self._shell)
            self._routes["/v1/messages"] = ("POST", self._anthropic.messages)
        else:
            self._gemini = GeminiHandler(self._shell)
            self._routes["/token"] = ("POST", self._gemini.token)

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
        value = header(scope, b"authorization")
        return value is not None and hmac.compare_digest(value, f"Bearer {key}".encode())

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        dialect = self._config.dialect
        # As vLLM's middleware: only /v1 needs the key; health, load and metrics are open.
        # Anthropic and Gemini check keys in their own handlers, in their own words.
        if (
            dialect in ("vllm", "openai")
            and path.startswith("/v1")
            and method != "OPTIONS"
            and not self._authorized(scope)
        ):
            unauthorized = openai_wire.unauthorized() if dialect == "openai" else None
            await send_error(send, unauthorized or errors.unauthorized())
            return
        if self._gemini is not None and self._gemini.handles(path):
            if method != "POST":
                await send_error(send, errors.method_not_allowed())
                return
            await self._gemini.generate(scope, receive, send)
            return
        route = self._routes.get(path)
        if route is None:
            await send_error(send, errors.route_not_found())
        elif route[0] != method:
            await send_error(send, errors.method_not_allowed())
        else:
            await route[1](scope, receive, send)

    # ---- small endpoints ----

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, [(b"content-length", b"0")], b"")

    async def _load(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"server_load": self._engine.server_load()})

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        config = self._config
        body = models_body(
            config.served_model_name, config.model, config.max_model_len, self._created
        )
        await send_json(send, 200, body)

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
        await send_bytes(send, 200, _METRICS, text.encode())

    async def _stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        # ?bodies=1: the last requests' bodies and headers too (what the gateway sent upstream).
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        bodies = query.get("bodies", ["0"])[-1] in ("1", "true")
        await send_json(send, 200, self._engine.stats().to_json(bodies=bodies))

    async def _reset(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._engine.reset()
        await send_json(send, 200, {"reset": True})

    # ---- chat completions (vllm and openai) ----

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        shell = self._shell
        body = await read_body(receive)
        if body is None:
            return
        shell.record(scope, body)
        openai = self._config.dialect == "openai"
        request = (
            openai_wire.parse_openai_request(body, self._config)
            if openai
            else parse_chat_request(body, self._config)
        )
        if isinstance(request, ApiError):
            await shell.refuse(send, request)
            return
        try:
            generation = plan_generation(request, self._config)
        except ScriptError as error:
            await shell.refuse(send, errors.script_error(str(error)))
            return
        fault = generation.fault
        if fault is not None and self._engine.fault_applies(generation.script_key, fault.times):
            await trio.sleep(generation.fault_delay_s)
            refusal = (
                openai_wire.openai_fault(fault)
                if openai
                else errors.simulated_fault(
                    fault.status, fault.body, fault.retry_after, fault.error
                )
            )
            await shell.refuse(send, refusal)
            return
        ctx = ResponseContext(
            response_id=f"chatcmpl-{secrets.token_hex(8)}",
            created=int(time.time()),
            model=self._config.served_model_name,
            system_fingerprint=self._fingerprint,
            prompt_tokens=request.prompt.tokens,
            tool_call_ids=tuple(
                f"{'call_' if openai else 'chatcmpl-tool-'}{secrets.token_hex(8)}"
                for _ in range(generation.tool_calls)
            ),
            include_usage=request.include_usage,
            continuous_usage=request.continuous_usage,
            dialect=self._config.dialect,
            prompt_details=self._config.enable_prompt_tokens_details,
        )
        fault_body = openai_wire.fault_body if openai else vllm_fault_body
        with shell.sequence(request, generation) as seq:
            if request.stream:
                renderer = StreamRenderer(ctx, generation, fault_body)
                await shell.stream(scope, receive, send, seq, generation, renderer, _SSE)
                return
            produced = await shell.generate(scope, receive, seq, generation)
            if produced is None:
                return
            answer = dumps(completion_body(ctx, generation, produced, seq.cached_tokens))

            def fault_error(fault: Fault) -> ApiError:
                headers = errors.retry_after_header(fault.retry_after)
                return ApiError(status=fault.status, body=fault_body(fault), headers=headers)

            await shell.answer(send, generation, produced, answer, fault_error)
