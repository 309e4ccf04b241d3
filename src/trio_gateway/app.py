"""The ASGI application: routes, request ids, and the one place errors become responses."""

from __future__ import annotations

import logging
import secrets
from functools import partial

import trio

from trio_gateway.config import GatewayConfig
from trio_gateway.errors import GatewayError, InternalError, MethodNotAllowed, RouteNotFound
from trio_gateway.fronts.chat import handle_chat
from trio_gateway.fronts.events_sse import handle_events
from trio_gateway.fronts.http import ClientGone, Receive, Scope, Send, send_error, send_json
from trio_gateway.fronts.ws import WebSocketFront
from trio_gateway.listen import Connections
from trio_gateway.metrics import CONTENT_TYPE
from trio_gateway.pipeline import Router

log = logging.getLogger("trio_gateway")

ROUTES = {
    "/v1/chat/completions": ("POST",),
    "/v1/events": ("POST",),
    "/v1/models": ("GET",),
    "/healthz": ("GET",),
    "/readyz": ("GET",),
    "/metrics": ("GET",),
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
        self.websocket = WebSocketFront(router, config.server, config.websocket, new_request_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            if scope["path"].rstrip("/") == "/v1/ws":
                await self.websocket.serve(
                    receive, send, partial(self.connections.abort, scope.get("client"))
                )
            else:
                await send({"type": "websocket.close", "code": 1008})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        method = scope["method"]
        request_id = new_request_id()
        self.open_requests += 1
        try:
            methods = ROUTES.get(path.rstrip("/") or "/")
            if methods is None:
                raise RouteNotFound(f"no route {path}; see /v1/chat/completions, /v1/models")
            if method not in methods:
                raise MethodNotAllowed(f"{path} accepts {', '.join(methods)}, not {method}")
            path = path.rstrip("/")
            drop = partial(self.connections.abort, scope.get("client"))
            if path == "/v1/chat/completions":
                await handle_chat(self.router, self.config.server, request_id, receive, send, drop)
            elif path == "/v1/events":
                await handle_events(
                    self.router, self.config.server, request_id, receive, send, drop
                )
            elif path == "/v1/models":
                await send_json(send, 200, self._models())
            elif path == "/healthz":
                await send_json(send, 200, {"status": "ok"})
            elif path == "/readyz":
                await self._readyz(send)
            elif path == "/metrics":
                await self._metrics(send)
            else:
                raise AssertionError(f"route {path} has no handler")
        except ClientGone:
            return
        except GatewayError as exc:
            await send_error(send, exc, [(b"x-request-id", request_id.encode())])
        except Exception:
            log.exception("internal error on %s %s (request %s)", method, path, request_id)
            error = InternalError(
                f"internal error (request {request_id}); the gateway's log has the details",
                request_id=request_id,
            )
            await send_error(send, error, [(b"x-request-id", request_id.encode())])
        finally:
            self.open_requests -= 1

    async def _readyz(self, send: Send) -> None:
        """Ready when every alias has a provider that is healthy or still starting."""
        ready = self.router.ready()
        not_ready = sorted(alias for alias, providers in ready.items() if not providers)
        now = trio.current_time()
        body = {
            "status": "not_ready" if not_ready else "ready",
            "aliases_without_provider": not_ready,
            "providers": {
                name: {
                    "state": snap.state.value,
                    "cooling_down": snap.cooling_down,
                    "last_error": snap.last_error,
                    "upstream_load": snap.upstream_load,
                }
                for name, health in self.router.health.items()
                for snap in [health.snapshot(now)]
            },
        }
        await send_json(send, 503 if not_ready else 200, body)

    async def _metrics(self, send: Send) -> None:
        payload = self.router.metrics.render()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", CONTENT_TYPE.encode()),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload, "more_body": False})

    def _models(self) -> dict[str, object]:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "trio-gateway"}
                for name in sorted(self.config.aliases)
            ],
        }
