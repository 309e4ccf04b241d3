"""Vertex AI credentials: OAuth2 access tokens from a service account, or a ready token.

The pure part (no I/O): read a service-account JSON file (:class:`ServiceAccount`), sign the
JWT grant Google's token endpoint takes (:func:`signed_jwt`, RS256), form its request body and
read its answer (:class:`AccessToken`). The thin I/O part: :class:`ServiceAccountTokens` keeps
one token per provider and exchanges a new grant before the old token runs out, one exchange at
a time; :class:`StaticToken` hands out a token the operator supplies.

Nothing here ever puts the private key, a grant or a token in an exception, a repr or a log:
keys and tokens are held as :class:`~trio_gateway.config.schema.Secret`, and an endpoint's
refusal is reported by its error code and description only, with anything credential-like redacted.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Final, Protocol
from urllib.parse import urlencode

import attrs
import httpx
import trio
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from trio_gateway.config.schema import Secret
from trio_gateway.core.errors import (
    GatewayError,
    UpstreamAuthFailed,
    UpstreamProtocolError,
    UpstreamServerError,
    UpstreamUnreachable,
)
from trio_gateway.providers.httpx_errors import map_httpx_errors, read_limited
from trio_gateway.providers.translate import redact_credentials

__all__ = [
    "CLOUD_PLATFORM_SCOPE",
    "DEFAULT_TOKEN_URI",
    "AccessToken",
    "ServiceAccount",
    "ServiceAccountTokens",
    "StaticToken",
    "TokenSource",
    "parse_token_response",
    "signed_jwt",
    "token_request_body",
]

DEFAULT_TOKEN_URI: Final = "https://oauth2.googleapis.com/token"
CLOUD_PLATFORM_SCOPE: Final = "https://www.googleapis.com/auth/cloud-platform"
JWT_BEARER_GRANT: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# Google grants at most an hour per assertion.
GRANT_LIFETIME_S: Final = 3600
# A token is replaced this long before it runs out, so a request never carries one that dies
# in flight and a failed exchange can be retried while the old token still works.
REFRESH_MARGIN_S: Final = 300.0
# After a failed exchange, while the old token is still good, the next try waits this long
# (otherwise every request in the margin would queue for its own failing exchange).
RETRY_AFTER_FAILURE_S: Final = 10.0
EXCHANGE_TIMEOUT_S: Final = 30.0
MAX_TOKEN_RESPONSE_BYTES: Final = 64 * 1024
MAX_DESCRIPTION_CHARS: Final = 300


# --- the service account -----------------------------------------------------------------------


def _load_rsa_key(pem: str) -> rsa.RSAPrivateKey:
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise TypeError("not an RSA key")
    return key


@attrs.frozen(kw_only=True)
class ServiceAccount:
    """The fields of a service-account key file the JWT grant needs."""

    client_email: str
    private_key: Secret  # PEM; its repr is <SECRET>
    private_key_id: str
    token_uri: str = DEFAULT_TOKEN_URI

    @classmethod
    def from_json(cls, text: str, *, source: str) -> ServiceAccount:
        """Read a key file's text; ``source`` names it in errors (a path, an env var).

        Raises ValueError naming the field that is missing or wrong, never quoting the file
        (it holds the private key). The key is loaded once here, so a bad one is found at
        start-up rather than at the first request.
        """
        try:
            data = json.loads(text)
        except ValueError:
            raise ValueError(f"{source}: not a JSON service-account key file") from None
        if not isinstance(data, dict):
            raise ValueError(f"{source}: not a JSON service-account key file")
        kind = data.get("type")
        if kind is not None and kind != "service_account":
            raise ValueError(
                f"{source}: credentials of type {str(kind)[:40]!r} are not a service account "
                '(expected "type": "service_account")'
            )
        fields: dict[str, str] = {}
        for key in ("client_email", "private_key", "private_key_id"):
            value = data.get(key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{source}: {key!r} is missing or not a non-empty string")
            fields[key] = value
        token_uri = data.get("token_uri", DEFAULT_TOKEN_URI)
        if not isinstance(token_uri, str) or not token_uri.startswith(("https://", "http://")):
            raise ValueError(f"{source}: 'token_uri' is not an http(s) URL")
        try:
            _load_rsa_key(fields["private_key"])
        except (ValueError, TypeError):
            raise ValueError(f"{source}: 'private_key' is not a PEM RSA private key") from None
        return cls(
            client_email=fields["client_email"],
            private_key=Secret(fields["private_key"]),
            private_key_id=fields["private_key_id"],
            token_uri=token_uri,
        )


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _json_segment(value: dict[str, object]) -> str:
    return _b64url(json.dumps(value, separators=(",", ":")).encode())


def signed_jwt(
    account: ServiceAccount,
    *,
    now: float,
    scope: str = CLOUD_PLATFORM_SCOPE,
    lifetime_s: int = GRANT_LIFETIME_S,
) -> str:
    """The RS256 JWT a service account presents to its ``token_uri`` (RFC 7523), issued at
    ``now`` (wall-clock seconds: Google compares it with its own clock)."""
    issued = int(now)
    header = _json_segment({"alg": "RS256", "typ": "JWT", "kid": account.private_key_id})
    claims = _json_segment(
        {
            "iss": account.client_email,
            "scope": scope,
            "aud": account.token_uri,
            "iat": issued,
            "exp": issued + lifetime_s,
        }
    )
    signing_input = f"{header}.{claims}".encode("ascii")
    key = _load_rsa_key(account.private_key.value)
    signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return f"{header}.{claims}.{_b64url(signature)}"


def token_request_body(jwt: str) -> bytes:
    """The form-encoded body of the jwt-bearer grant."""
    return urlencode({"grant_type": JWT_BEARER_GRANT, "assertion": jwt}).encode("ascii")


# --- the token ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AccessToken:
    value: Secret
    expires_at: float  # wall-clock seconds

    def needs_refresh(self, now: float, margin_s: float = REFRESH_MARGIN_S) -> bool:
        return now >= self.expires_at - margin_s

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


def _refusal(status: int, body: bytes) -> str:
    """``{"error": "invalid_grant", "error_description": "..."}`` → a safe summary."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        summary = parsed["error"]
        description = parsed.get("error_description")
        if isinstance(description, str) and description:
            summary += f": {description}"
    else:
        summary = body.decode("utf-8", "replace").strip() or "(empty body)"
    return f"HTTP {status}, " + redact_credentials(summary)[:MAX_DESCRIPTION_CHARS]


def parse_token_response(
    status: int, body: bytes, *, now: float, provider: str | None = None
) -> AccessToken:
    """The token endpoint's answer → the token, or the error to raise.

    A 4xx is a refusal (a wrong or revoked key, a clock far off, a disabled account):
    ``UpstreamAuthFailed``. A 5xx or 429 is the endpoint's own trouble: ``UpstreamServerError``.
    """
    where = f"{provider}: " if provider else ""
    if status == 429 or status >= 500:
        raise UpstreamServerError(
            f"{where}the oauth2 token endpoint failed ({_refusal(status, body)})",
            provider=provider,
        )
    if status != 200:
        raise UpstreamAuthFailed(
            f"{where}the oauth2 token endpoint refused the service account's grant "
            f"({_refusal(status, body)})",
            provider=provider,
        )
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    token = parsed.get("access_token") if isinstance(parsed, dict) else None
    lifetime = parsed.get("expires_in") if isinstance(parsed, dict) else None
    if not isinstance(token, str) or not token:
        raise UpstreamProtocolError(
            f"{where}the oauth2 token endpoint answered 200 without an access_token",
            provider=provider,
        )
    if isinstance(lifetime, bool) or not isinstance(lifetime, int | float) or lifetime <= 0:
        raise UpstreamProtocolError(
            f"{where}the oauth2 token endpoint answered without a valid expires_in",
            provider=provider,
        )
    return AccessToken(value=Secret(token), expires_at=now + float(lifetime))


# --- the I/O -----------------------------------------------------------------------------------


class TokenSource(Protocol):
    async def token(self) -> str:
        """A valid access token (the bearer credential for Vertex AI)."""
        ...


@attrs.frozen
class StaticToken:
    """A token the operator supplies (``api_key_env`` / ``api_key_file`` of a vertex provider,
    e.g. from ``gcloud auth print-access-token``): handed out as is, never refreshed."""

    value: Secret

    async def token(self) -> str:
        return self.value.value


class ServiceAccountTokens:
    """One service account's access token, exchanged when it is about to run out.

    At most one exchange runs at a time: callers that find the token due wait on a lock, and
    the first one through refreshes it for all. ``clock`` is wall-clock time (the JWT's ``iat``
    and ``exp`` are compared with Google's clock, and a token's expiry is a wall-clock instant),
    replaceable so tests can drive it.
    """

    def __init__(
        self,
        account: ServiceAccount,
        client: httpx.AsyncClient,
        *,
        provider: str,
        clock: Callable[[], float] = time.time,
        scope: str = CLOUD_PLATFORM_SCOPE,
        timeout_s: float = EXCHANGE_TIMEOUT_S,
    ) -> None:
        self._account = account
        self._client = client
        self._provider = provider
        self._clock = clock
        self._scope = scope
        self._timeout_s = timeout_s
        self._lock = trio.Lock()
        self._token: AccessToken | None = None
        self._retry_at = 0.0
        self.exchanges = 0  # grants sent, for tests and statistics

    async def token(self) -> str:
        token = self._token
        if token is not None and not token.needs_refresh(self._clock()):
            return token.value.value
        async with self._lock:
            # Another caller may have refreshed it while this one waited.
            token = self._token
            now = self._clock()
            if token is not None and not token.needs_refresh(now):
                return token.value.value
            if token is not None and not token.expired(now) and now < self._retry_at:
                return token.value.value
            try:
                self._token = await self._exchange()
            except GatewayError:
                if token is None or token.expired(self._clock()):
                    raise
                # The old token still works: use it, and try again a little later.
                self._retry_at = self._clock() + RETRY_AFTER_FAILURE_S
                return token.value.value
            return self._token.value.value

    async def _exchange(self) -> AccessToken:
        provider = self._provider
        self.exchanges += 1
        jwt = signed_jwt(self._account, now=self._clock(), scope=self._scope)
        headers = {"content-type": "application/x-www-form-urlencoded"}
        try:
            with trio.fail_after(self._timeout_s), map_httpx_errors(provider):
                async with self._client.stream(
                    "POST",
                    self._account.token_uri,
                    content=token_request_body(jwt),
                    headers=headers,
                ) as response:
                    body = await read_limited(response, MAX_TOKEN_RESPONSE_BYTES)
                    status = response.status_code
        except trio.TooSlowError:
            raise UpstreamUnreachable(
                f"{provider}: the oauth2 token endpoint did not answer within "
                f"{self._timeout_s:g} s",
                provider=provider,
            ) from None
        return parse_token_response(status, body, now=self._clock(), provider=provider)
