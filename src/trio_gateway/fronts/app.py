"""The ASGI application: routes, request ids, and the one place errors become responses."""

from __future__ import annotations

import logging
import secrets
import time
from functools import partial

import trio

from trio_gateway.accounting.key_store import KeyStore
from trio_gateway.config.checks import is_loopback
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.core.errors import (
    GatewayError,
    InternalError,
    MethodNotAllowed,
    ModelNotFound,
    RouteNotFound,
)
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.usage import UsageRecord, refused_record
from trio_gateway.core.words import counted
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.auth import http_key
from trio_gateway.fronts.chat import handle_chat
from trio_gateway.fronts.completions import handle_completions, handle_embeddings
from trio_gateway.fronts.direct import ClientSocket
from trio_gateway.fronts.events_sse import handle_events
from trio_gateway.fronts.http import (
    ClientGone,
    ErrorShape,
    Receive,
    Scope,
    Send,
    send_error,
    send_json,
)
from trio_gateway.fronts.http import openai_error as openai_error_shape
from trio_gateway.fronts.messages.events import anthropic_error
from trio_gateway.fronts.messages.route import handle_count_tokens, handle_messages
from trio_gateway.fronts.operator import OPERATOR_PATHS, serve_operator
from trio_gateway.fronts.responses.route import handle_responses, handle_stored
from trio_gateway.fronts.responses.socket import ResponsesSocketFront
from trio_gateway.fronts.ws import WebSocketFront, refuse_upgrade
from trio_gateway.http1.listen import Connections
from trio_gateway.http1.server import HANG_UP_EXTENSION
from trio_gateway.ops.access import RequestContext, log_access, request_context
from trio_gateway.ops.access import current as current_request
from trio_gateway.ops.tracing import clean_request_id, trace_for

log = logging.getLogger("trio_gateway")

# HEAD wherever GET: monitors probe with it, and one that gets a 405 marks the gateway down.
# The app answers a HEAD as the GET; the server sends the head only (hypercorn too, on HTTP/2).
ROUTES = {
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/v1/embeddings": ("POST",),
    "/v1/events": ("POST",),
    "/v1/messages": ("POST",),
    "/v1/messages/count_tokens": ("POST",),
    "/v1/models": ("GET", "HEAD"),
    "/healthz": ("GET", "HEAD"),
    "/readyz": ("GET", "HEAD"),
    "/metrics": ("GET", "HEAD"),
    "/": ("GET", "HEAD"),
    "/status": ("GET", "HEAD"),
    "/status.json": ("GET", "HEAD"),
    # The Responses front (fronts/responses/route.py): a stored response by id.
    "/v1/responses": ("POST",),
    "/v1/responses/{id}": ("GET", "HEAD", "DELETE"),
}
MODEL_PREFIX = "/v1/models/"
RESPONSE_PREFIX = "/v1/responses/"
# An unknown path is logged, but not at any length.
MAX_LOGGED_PATH_CHARS = 200
# Every route, for the 404's hint (a test checks it against ROUTES).
ROUTE_LIST = (
    "POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, POST /v1/events, "
    "POST /v1/messages, POST /v1/messages/count_tokens, "
    "GET /v1/models, GET /v1/models/{id}, "
    "GET /v1/ws (WebSocket), GET /healthz, GET /readyz, GET /metrics, GET / (status page), "
    "GET /status, GET /status.json, "
    "POST /v1/responses, GET /v1/responses (WebSocket), GET /v1/responses/{id}, "
    "DELETE /v1/responses/{id}"
)
# WebSocket upgrades the gateway's HTTP/1.1 server serves itself (http1/websocket.py: several
# messages in one write); the others (/v1/ws) go to hypercorn's.
OWN_WEBSOCKET_PATHS = frozenset({"/v1/responses"})
# The paths a WebSocket upgrade may ask for, for the 404 of any other.
WEBSOCKET_ROUTE_LIST = "GET /v1/ws, GET /v1/responses (the Responses API's WebSocket mode)"
# Paths that need an API key when the gateway has keys; the operator's endpoints have their own
# rules (fronts/operator.py).
KEYED_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/events",
        "/v1/models",
        "/v1/responses",
        "/v1/responses/{id}",
        "/v1/messages",
        "/v1/messages/count_tokens",
    }
)
# Routes whose every request gets a usage record (relay.record once it is under way), and the
# endpoint the record names: the request's kind, or the front's name (ChatRequest.front).
METERED_ROUTES = {
    "/v1/chat/completions": RequestKind.CHAT.value,
    "/v1/events": RequestKind.CHAT.value,
    "/v1/completions": RequestKind.COMPLETIONS.value,
    "/v1/embeddings": RequestKind.EMBEDDINGS.value,
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
# How each front words its errors, those of the app included (a 401, a 404 of a path under it):
# by the longest listed prefix of the path, OpenAI's shape where none is listed.
ERROR_SHAPES: dict[str, ErrorShape] = {"/v1/messages": anthropic_error}
# The handlers of the routes that relay an answer.
RELAYED = {
    "/v1/chat/completions": handle_chat,
    "/v1/events": handle_events,
    "/v1/completions": handle_completions,
    "/v1/embeddings": handle_embeddings,
    "/v1/responses": handle_responses,
    "/v1/messages": handle_messages,
    "/v1/messages/count_tokens": handle_count_tokens,
}


def new_request_id() -> str:
    return secrets.token_hex(12)


class GatewayApp:
    def __init__(
        self, config: GatewayConfig, router: Router, connections: Connections | None = None
    ) -> None:
        self.config = config
        self.router = router
        # The client connections, so a handler whose client stalled can drop its own.
        self.connections = connections if connections is not None else Connections()
        # Handlers still running, including those stuck writing to a client that stopped reading.
        self.open_requests = 0
        self.keys = open_keys(config)
        self.websocket = WebSocketFront(
            router, config.server, config.websocket, new_request_id, self.keys
        )
        # The Responses API's WebSocket mode; its sockets count against the same max_sockets.
        self.responses_socket = ResponsesSocketFront(
            router,
            config.server,
            config.websocket,
            new_request_id,
            self.keys,
            self.websocket.places,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An HTTP request: names it (the client's x-request-id and trace, or new ones), serves
        it, and writes its access line when it ends, however it ends. Here, not in a coroutine
        of its own: each of thousands of open answers holds every frame of its chain."""
        if scope["type"] != "http":
            await self._not_http(scope, receive, send)
            return
        started = trio.current_time()
        named = _named_headers(scope)
        traceparent, tracestate = named.get(b"traceparent"), named.get(b"tracestate")
        tracing = self.router.tracing
        span = None
        if tracing is None or (path := scope["path"].rstrip("/")) not in RELAYED:
            trace = trace_for(traceparent, tracestate)
        else:
            # Tracing on: the front's requests get a span of their own (ops/spans.py).
            span, trace = tracing.start(f"{scope['method']} {path}", traceparent, tracestate)
        context = RequestContext(
            request_id=clean_request_id(named.get(b"x-request-id")) or new_request_id(),
            route=f"{scope['method']} {scope['path'][:MAX_LOGGED_PATH_CHARS]}",
            trace=trace,
            priority_header=named.get(b"x-priority"),
            anthropic_beta=named.get(b"anthropic-beta"),
            span=span,
        )
        with request_context(context):
            try:
                await self._serve_http(
                    scope, receive, send, context.request_id, named.get(b"x-session-id")
                )
            finally:
                log_access(context, trio.current_time() - started)
                self.router.metrics.http_request(
                    _route_label(scope["path"]), str(context.status or 0)
                )
                if span is not None:
                    span.end(context.status, context.alias)

    def refused_by_server(self, status: int, code: str) -> None:
        """A request the HTTP/1.x server answered itself (malformed, too large, too slow): its
        access line and its count, as for any other. Its route is unknown ("-")."""
        context = RequestContext(
            request_id=new_request_id(),
            route="-",
            trace=trace_for(None, None),
            status=status,
            outcome="refused",
            code=code,
        )
        log_access(context, 0.0)
        self.router.metrics.http_request("other", str(status))

    async def _not_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            path = scope["path"].rstrip("/")
            drop = partial(self.connections.abort, scope.get("client"))
            if path == "/v1/ws":
                await self.websocket.serve(receive, send, drop, scope)
            elif path == "/v1/responses":
                await self.responses_socket.serve(receive, send, drop, scope)
            else:
                await self._no_websocket_route(scope, receive, send)

    async def _no_websocket_route(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket upgrade to a path that takes none: a 404 naming those that do."""
        if (await receive())["type"] != "websocket.connect":
            return
        path = scope["path"][:MAX_LOGGED_PATH_CHARS]
        error = RouteNotFound(
            f"no WebSocket route {path}; the WebSocket routes are {WEBSOCKET_ROUTE_LIST}"
        )
        await refuse_upgrade(send, scope, error)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _serve_http(
        self, scope: Scope, receive: Receive, send: Send, request_id: str, session: str | None
    ) -> None:
        path = scope["path"]
        method = scope["method"]
        started_wall, started = time.time(), trio.current_time()
        self.open_requests += 1
        key: ApiKey | None = None
        try:
            route = path.rstrip("/") or "/"
            model_id = None
            if route.startswith(MODEL_PREFIX) and len(route) > len(MODEL_PREFIX):
                # /v1/models/{id}: the SDK's models.retrieve. An alias may hold a "/".
                route, model_id = "/v1/models", route[len(MODEL_PREFIX) :]
            elif route.startswith(RESPONSE_PREFIX) and len(route) > len(RESPONSE_PREFIX):
                route, model_id = "/v1/responses/{id}", route[len(RESPONSE_PREFIX) :]
            methods = ROUTES.get(route)
            if methods is None:
                raise RouteNotFound(f"no route {path}; the routes are {ROUTE_LIST}")
            if method not in methods:
                raise MethodNotAllowed(f"{path} accepts {', '.join(methods)}, not {method}")
            path = route
            key = http_key(scope, self.keys) if path in KEYED_PATHS else None
            drop = partial(self.connections.abort, scope.get("client"))
            client = self._client_socket(scope)
            handle = RELAYED.get(path)
            if handle is not None:
                await handle(
                    self.router,
                    self.config.server,
                    request_id,
                    receive,
                    send,
                    drop,
                    key,
                    client,
                    session,
                )
            elif path == "/v1/responses/{id}" and model_id is not None:
                await handle_stored(self.router, method, model_id, key, send)
            elif path == "/v1/models" and model_id is not None:
                await send_json(send, 200, self._model(model_id, key))
            elif path == "/v1/models":
                await send_json(send, 200, self._models(key))
            elif path in OPERATOR_PATHS:
                await serve_operator(
                    path, scope, send, config=self.config, router=self.router, keys=self.keys
                )
            else:
                raise AssertionError(f"route {path} has no handler")
        except ClientGone:
            self._refused(
                scope, request_id, key, "client_gone", started_wall, started, cancelled=True
            )
            return
        except GatewayError as exc:
            self._refused(scope, request_id, key, exc.code, started_wall, started)
            named = [(b"x-request-id", request_id.encode())]
            await send_error(send, exc, named, error_shape(scope["path"]))
        except Exception:
            log.exception("internal error on %s %s (request %s)", method, path, request_id)
            error = InternalError(
                f"internal error (request {request_id}); the gateway's log has the details",
                request_id=request_id,
            )
            named = [(b"x-request-id", request_id.encode())]
            await send_error(send, error, named, error_shape(scope["path"]))
        finally:
            self.open_requests -= 1

    def _client_socket(self, scope: Scope) -> ClientSocket | None:
        """The socket an HTTP/1.x answer's body may be written to directly (fronts/direct.py).
        Over HTTP/2 one socket carries many streams, each framed by hypercorn: none."""
        version = scope.get("http_version")
        if version not in ("1.1", "1.0"):
            return None
        sock = self.connections.socket(scope.get("client"))
        if sock is None:
            return None
        hang_ups = scope["extensions"].get(HANG_UP_EXTENSION) if "extensions" in scope else None
        return ClientSocket(sock, chunked=version == "1.1", hang_ups=hang_ups)

    def _refused(
        self,
        scope: Scope,
        request_id: str,
        key: ApiKey | None,
        code: str,
        started_wall: float,
        started: float,
        *,
        cancelled: bool = False,
    ) -> None:
        """A metered request that ended before the relay (which records the others), under the
        alias its body named once that was read (chat.read_chat_request)."""
        endpoint = METERED_ROUTES.get(scope["path"].rstrip("/"))
        if endpoint is None:
            return
        context = current_request()
        record = refused_record(
            request_id=request_id,
            key=key.name if key is not None else None,
            alias=context.alias if context is not None else None,
            error_code=code,
            started_at=started_wall,
            duration_s=trio.current_time() - started,
            cancelled=cancelled,
            endpoint=endpoint,
        )
        self.router.usage.offer(record)
        count_refused(self.router, record)

    def _model(self, model_id: str, key: ApiKey | None) -> dict[str, object]:
        """One alias; one the key may not use is as unknown as one that does not exist."""
        if model_id not in self.config.aliases or (key is not None and not key.allows(model_id)):
            raise ModelNotFound(
                f"The model '{model_id}' does not exist; GET /v1/models lists the aliases",
                param="model",
            )
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "trio-gateway"}

    def _models(self, key: ApiKey | None) -> dict[str, object]:
        """The aliases, or those the caller's key may use."""
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "trio-gateway"}
                for name in sorted(self.config.aliases)
                if key is None or key.allows(name)
            ],
        }


def error_shape(path: str) -> ErrorShape:
    """The error shape of the front a path belongs to (``ERROR_SHAPES``)."""
    best: tuple[int, ErrorShape] = (0, openai_error_shape)
    for prefix, shape in ERROR_SHAPES.items():
        if path.startswith(prefix) and len(prefix) > best[0]:
            best = (len(prefix), shape)
    return best[1]


def _route_label(path: str) -> str:
    """A bounded label: a route of ROUTES, the model route, or 'other' (never a client's path)."""
    route = path.rstrip("/") or "/"
    if route in ROUTES:
        return route
    if route.startswith(MODEL_PREFIX):
        return "/v1/models/{id}"
    if route.startswith(RESPONSE_PREFIX):
        return "/v1/responses/{id}"
    return "other"


def count_refused(router: Router, record: UsageRecord) -> None:
    """A chat request refused (or left) before routing: in gateway_requests_total too, under
    no alias, since an alias the config does not know must never become a label value."""
    router.metrics.request("", "", record.outcome, record.error_code or "")
    if (context := current_request()) is not None:
        context.record(record)


# The request headers the app reads, found in one pass over the headers instead of one each.
NAMED_HEADERS = frozenset(
    {
        b"x-request-id",
        b"traceparent",
        b"tracestate",
        b"x-session-id",
        b"x-priority",
        b"anthropic-beta",
    }
)


def _named_headers(scope: Scope) -> dict[bytes, str]:
    """Those of :data:`NAMED_HEADERS` the request has, as text; the first of a repeated one,
    as ``fronts.http.header`` finds it."""
    found: dict[bytes, str] = {}
    for name, value in scope.get("headers", ()):
        if name in NAMED_HEADERS and name not in found:
            found[name] = bytes(value).decode("latin-1")
    return found


def open_keys(config: GatewayConfig) -> KeyStore | None:
    """The API keys named by ``[auth]``, or None when the gateway serves without keys; says
    which at start-up. Config loading has already checked the file."""
    keys_file = config.auth.keys_file
    if keys_file is None:
        if config.auth.open:
            # On an address others can reach, anyone there is served: worth more than INFO.
            level = logging.INFO if is_loopback(config.server.listen) else logging.WARNING
            log.log(
                level,
                "auth: OPEN (no keys file): [auth] open = true, any caller reaching %s is served",
                config.server.listen,
            )
        else:
            log.warning(
                "auth: OPEN (no keys file): no [auth] in %s; allowed because %s is loopback",
                config.source,
                config.server.listen,
            )
        return None
    keys = KeyStore(keys_file, known_aliases=config.aliases.keys())
    log.info("auth: %s from %s", counted(len(keys.ring()), "key"), keys_file)
    return keys
