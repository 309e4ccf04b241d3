"""The `gemini` dialect's handlers: generateContent / streamGenerateContent on AI Studio and
Vertex AI paths, and the OAuth token endpoint Vertex clients refresh their tokens at."""

from __future__ import annotations

import collections
import hmac
import itertools
import secrets
import time
from urllib.parse import parse_qs

import attrs
import trio

from . import oauth
from .errors import ApiError
from .gemini_signatures import new_key
from .gemini_wire import (
    GeminiContext,
    GeminiRoute,
    GeminiStream,
    gemini_fault,
    google_error,
    parse_generate_request,
    parse_route,
    response_body,
)
from .script import ScriptError, plan_generation
from .shell import Receive, Scope, Send, Shell, header, read_body, send_json
from .wire import dumps

__all__ = ["GeminiHandler"]

# Access tokens remembered for the Vertex check; the oldest are forgotten first.
MAX_ISSUED_TOKENS = 1024
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_STREAM_JSON = [(b"content-type", b"application/json; charset=UTF-8")]


def _missing_key() -> ApiError:
    return google_error(
        403,
        "Method doesn't allow unregistered callers (callers without established identity). "
        "Please use API key or other form of API consumer identity to call this API.",
    )


def _invalid_key() -> ApiError:
    # Google answers a wrong AI Studio key with a 400, not a 401.
    info = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "API_KEY_INVALID",
        "domain": "googleapis.com",
        "metadata": {"service": "generativelanguage.googleapis.com"},
    }
    return google_error(400, "API key not valid. Please pass a valid API key.", details=[info])


def _unauthenticated() -> ApiError:
    return google_error(
        401,
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
        "cookie or other valid authentication credential. See "
        "https://developers.google.com/identity/sign-in/web/devconsole-project.",
    )


class GeminiHandler:
    def __init__(self, shell: Shell) -> None:
        self._shell = shell
        # Thoughts always arrive as thought parts here, whatever vLLM's parser flag says.
        self._config = attrs.evolve(shell.config, reasoning_parser=True)
        self._token_ids = itertools.count(1)
        # access token -> monotonic expiry
        self._tokens: collections.OrderedDict[str, float] = collections.OrderedDict()
        # Each simulator signs with its own key: another one's signatures are foreign to it,
        # as they are to Google's other routes and models.
        self._signing_key = new_key()

    @staticmethod
    def handles(path: str) -> bool:
        return parse_route(path) is not None

    # ---- auth ----

    def _token_valid(self, token: bytes) -> bool:
        expiry = self._tokens.get(token.decode("latin-1"))
        return expiry is not None and time.monotonic() < expiry

    def _check_auth(self, scope: Scope, route: GeminiRoute) -> ApiError | None:
        key = self._config.api_key
        if route.vertex:
            bearer = header(scope, b"authorization") or b""
            token = bearer[7:] if bearer[:7].lower() == b"bearer " else b""
            if self._token_valid(token):
                return None
            if self._config.vertex_require_token or not token:
                return _unauthenticated()
            if key is None or hmac.compare_digest(token, key.encode()):
                return None
            return _unauthenticated()
        if key is None:
            return None
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = header(scope, b"x-goog-api-key")
        if given is None and "key" in query:
            given = query["key"][0].encode()
        if given is None:
            return _missing_key()
        return None if hmac.compare_digest(given, key.encode()) else _invalid_key()

    # ---- POST /token ----

    async def token(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        if body is None:
            return
        host = (header(scope, b"host") or b"").decode("latin-1")
        token_url = f"{scope.get('scheme', 'http')}://{host}{scope['path']}"
        problem = oauth.check_grant(
            body,
            token_url=token_url,
            now=time.time(),
            public_key_pem=self._config.oauth_public_key_pem,
        )
        if problem is not None:
            error = {"error": "invalid_grant", "error_description": problem}
            await send_json(send, 400, error)
            return
        lifetime = self._config.oauth_token_lifetime_s
        access_token = f"sim-token-{next(self._token_ids)}"
        self._tokens[access_token] = time.monotonic() + lifetime
        while len(self._tokens) > MAX_ISSUED_TOKENS:
            self._tokens.popitem(last=False)
        self._shell.engine.note_token_grant()
        answer = {"access_token": access_token, "expires_in": lifetime, "token_type": "Bearer"}
        await send_json(send, 200, answer)

    # ---- generateContent / streamGenerateContent ----

    async def generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        shell = self._shell
        route = parse_route(scope["path"])
        assert route is not None  # routed here by `handles`
        body = await read_body(receive)
        if body is None:
            return
        problem = self._check_auth(scope, route)
        if problem is not None:
            await shell.refuse(send, problem)
            return
        shell.record(scope, body)
        parsed = parse_generate_request(body, self._config, route, signing_key=self._signing_key)
        if isinstance(parsed, ApiError):
            await shell.refuse(send, parsed)
            return
        request = parsed.chat
        try:
            generation = plan_generation(request, self._config)
        except ScriptError as error:
            await shell.refuse(send, google_error(400, f"sim script: {error}"))
            return
        fault = generation.fault
        if fault is not None and shell.engine.fault_applies(generation.script_key, fault.times):
            await trio.sleep(generation.fault_delay_s)
            await shell.refuse(send, gemini_fault(fault))
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        ctx = GeminiContext(
            response_id=secrets.token_urlsafe(16),
            model=self._config.served_model_name,
            prompt_tokens=request.prompt.tokens,
            include_thoughts=parsed.include_thoughts,
            thinking=request.thinking,
            signing_key=self._signing_key,
            sse=query.get("alt") == ["sse"],
        )
        with shell.sequence(request, generation) as seq:
            if route.stream:
                renderer = GeminiStream(ctx, generation)
                headers = _SSE if ctx.sse else _STREAM_JSON
                await shell.stream(scope, receive, send, seq, generation, renderer, headers)
                return
            produced = await shell.generate(scope, receive, seq, generation)
            if produced is None:
                return
            answer = dumps(response_body(ctx, generation, produced, seq.cached_tokens))
            await shell.answer(send, generation, produced, answer, gemini_fault)
