"""Vertex AI service-account credentials: the JWT grant, the token's life, one exchange at a time.

The token endpoint is Google's, so the exchange is tested against ``httpx.MockTransport``; the
JWT is checked with the public half of a key pair made here.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
import trio
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from google.auth import jwt as google_jwt

from trio_gateway.config.schema import Secret
from trio_gateway.core.errors import (
    UpstreamAuthFailed,
    UpstreamProtocolError,
    UpstreamServerError,
    UpstreamUnreachable,
)
from trio_gateway.providers.gemini.vertex_auth import (
    AccessToken,
    ServiceAccount,
    ServiceAccountTokens,
    StaticToken,
    parse_token_response,
    signed_jwt,
    token_request_body,
)

KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PEM = KEY.private_bytes(
    serialization.Encoding.PEM,
    serialization.PrivateFormat.PKCS8,
    serialization.NoEncryption(),
).decode()
# The part of the PEM body that would show if a key leaked into a message.
KEY_MARK = PEM.splitlines()[5]
TOKEN_URI = "https://oauth2.googleapis.com/token"
KEY_FILE = {
    "type": "service_account",
    "project_id": "my-project",
    "private_key_id": "kid-123",
    "private_key": PEM,
    "client_email": "gateway@my-project.iam.gserviceaccount.com",
    "client_id": "1",
    "token_uri": TOKEN_URI,
}
ACCOUNT = ServiceAccount.from_json(json.dumps(KEY_FILE), source="sa.json")
NOW = 1_800_000_000.0


def b64url_decode(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def decode_jwt(jwt: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Header and claims, after checking the signature with the public key."""
    header, claims, signature = jwt.split(".")
    KEY.public_key().verify(
        b64url_decode(signature),
        f"{header}.{claims}".encode(),
        padding.PKCS1v15(),
        hashes.SHA256(),
    )
    return json.loads(b64url_decode(header)), json.loads(b64url_decode(claims))


# --- the key file ------------------------------------------------------------------------------


def test_from_json_reads_the_fields() -> None:
    assert ACCOUNT.client_email == KEY_FILE["client_email"]
    assert ACCOUNT.private_key_id == "kid-123"
    assert ACCOUNT.token_uri == TOKEN_URI
    assert ACCOUNT.private_key.value == PEM
    without_uri = {k: v for k, v in KEY_FILE.items() if k != "token_uri"}
    default = ServiceAccount.from_json(json.dumps(without_uri), source="sa.json")
    assert default.token_uri == "https://oauth2.googleapis.com/token"


def test_repr_never_shows_the_key() -> None:
    text = repr(ACCOUNT)
    assert "<SECRET>" in text
    assert "PRIVATE KEY" not in text and KEY_MARK not in text


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"client_email": None}, "'client_email' is missing"),
        ({"private_key": ""}, "'private_key' is missing"),
        ({"private_key_id": 5}, "'private_key_id' is missing"),
        ({"token_uri": "ftp://x"}, "'token_uri' is not an http(s) URL"),
        ({"type": "authorized_user"}, "not a service account"),
        ({"private_key": PEM.replace(KEY_MARK, "A" * len(KEY_MARK))}, "not a PEM RSA private key"),
    ],
)
def test_from_json_names_what_is_wrong(change: dict[str, Any], complaint: str) -> None:
    data = {**KEY_FILE, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ValueError) as caught:
        ServiceAccount.from_json(json.dumps(data), source="/etc/sa.json")
    message = str(caught.value)
    assert message.startswith("/etc/sa.json: ")
    assert complaint in message
    assert KEY_MARK not in message and "PRIVATE KEY" not in message


def test_from_json_does_not_quote_a_broken_file() -> None:
    broken = json.dumps(KEY_FILE)[:-3]
    with pytest.raises(ValueError) as caught:
        ServiceAccount.from_json(broken, source="sa.json")
    assert KEY_MARK not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__context__ is not None
    assert caught.value.__suppress_context__


# --- the grant ---------------------------------------------------------------------------------


def test_signed_jwt_verifies_with_the_public_key() -> None:
    jwt = signed_jwt(ACCOUNT, now=NOW + 0.7)
    header, claims = decode_jwt(jwt)
    assert header == {"alg": "RS256", "typ": "JWT", "kid": "kid-123"}
    assert claims == {
        "iss": "gateway@my-project.iam.gserviceaccount.com",
        "scope": "https://www.googleapis.com/auth/cloud-platform",
        "aud": TOKEN_URI,
        "iat": int(NOW),
        "exp": int(NOW) + 3600,
    }
    assert "=" not in jwt
    tampered = jwt[:-4] + ("AAAA" if not jwt.endswith("AAAA") else "BBBB")
    with pytest.raises(InvalidSignature):
        decode_jwt(tampered)


def test_google_auth_accepts_the_jwt() -> None:
    """Google's own library (google-auth, which google-genai brings) as the judge."""
    public_pem = KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    jwt = signed_jwt(ACCOUNT, now=time.time())
    claims = google_jwt.decode(jwt, certs=public_pem, audience=TOKEN_URI)  # type: ignore[no-untyped-call]
    assert claims["iss"] == ACCOUNT.client_email
    header = google_jwt.decode_header(jwt)  # type: ignore[no-untyped-call]
    assert header["kid"] == "kid-123"


def test_signed_jwt_scope_and_lifetime() -> None:
    _, claims = decode_jwt(signed_jwt(ACCOUNT, now=NOW, scope="s1 s2", lifetime_s=600))
    assert claims["scope"] == "s1 s2"
    assert claims["exp"] - claims["iat"] == 600


def test_token_request_body_is_the_jwt_bearer_grant() -> None:
    form = parse_qs(token_request_body("a.b.c").decode())
    assert form == {
        "grant_type": ["urn:ietf:params:oauth:grant-type:jwt-bearer"],
        "assertion": ["a.b.c"],
    }


# --- the answer --------------------------------------------------------------------------------


def test_parse_token_response() -> None:
    body = json.dumps({"access_token": "ya29.tok", "expires_in": 3599, "token_type": "Bearer"})
    token = parse_token_response(200, body.encode(), now=NOW)
    assert token.value.value == "ya29.tok"
    assert token.expires_at == NOW + 3599
    assert "ya29" not in repr(token)
    assert not token.needs_refresh(NOW)
    assert not token.needs_refresh(NOW + 3599 - 301)
    assert token.needs_refresh(NOW + 3599 - 300)
    assert token.needs_refresh(NOW + 3599 - 10, margin_s=30)
    assert not token.expired(NOW + 3598)


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (
            400,
            b'{"error": "invalid_grant", "error_description": "Invalid JWT Signature."}',
            UpstreamAuthFailed,
        ),
        (401, b'{"error": "invalid_client"}', UpstreamAuthFailed),
        (400, b"<html>nope</html>", UpstreamAuthFailed),
        (503, b"busy", UpstreamServerError),
        (429, b"slow down", UpstreamServerError),
        (200, b'{"expires_in": 3599}', UpstreamProtocolError),
        (200, b'{"access_token": "t", "expires_in": "soon"}', UpstreamProtocolError),
        (200, b"not json", UpstreamProtocolError),
    ],
)
def test_refusals(status: int, body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_token_response(status, body, now=NOW, provider="vtx")


def test_a_refusal_never_echoes_the_assertion_or_the_key() -> None:
    jwt = signed_jwt(ACCOUNT, now=NOW)
    # An endpoint that quotes what it was sent.
    body = json.dumps({"error": "invalid_grant", "error_description": f"bad assertion {jwt}"})
    with pytest.raises(UpstreamAuthFailed) as caught:
        parse_token_response(400, body.encode(), now=NOW, provider="vtx")
    message = str(caught.value)
    assert "invalid_grant" in message and "bad assertion" in message
    assert jwt not in message and jwt.split(".")[1] not in message
    assert KEY_MARK not in message


# --- the token source --------------------------------------------------------------------------


class FakeClock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class TokenEndpoint:
    """Google's token endpoint as a MockTransport handler: counts grants, checks each one."""

    def __init__(self, *, lifetime_s: int = 3600, delay_s: float = 0.0) -> None:
        self.grants: list[dict[str, Any]] = []
        self.lifetime_s = lifetime_s
        self.delay_s = delay_s
        self.refuse = False
        self.fail = False

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url == TOKEN_URI
        assert request.headers["content-type"] == "application/x-www-form-urlencoded"
        form = parse_qs(request.content.decode())
        _, claims = decode_jwt(form["assertion"][0])
        self.grants.append(claims)
        if self.delay_s:
            await trio.sleep(self.delay_s)
        if self.fail:
            return httpx.Response(503, text="unavailable")
        if self.refuse:
            return httpx.Response(400, json={"error": "invalid_grant", "error_description": "no"})
        number = len(self.grants)
        return httpx.Response(
            200, json={"access_token": f"ya29.t{number}", "expires_in": self.lifetime_s}
        )


def tokens(
    endpoint: Callable[[httpx.Request], Any], clock: FakeClock, **kwargs: Any
) -> ServiceAccountTokens:
    client = httpx.AsyncClient(transport=httpx.MockTransport(endpoint))
    return ServiceAccountTokens(ACCOUNT, client, provider="vtx", clock=clock, **kwargs)


async def test_the_token_is_cached_and_refreshed_before_it_expires() -> None:
    endpoint = TokenEndpoint()
    clock = FakeClock()
    source = tokens(endpoint, clock)
    assert await source.token() == "ya29.t1"
    assert endpoint.grants[0]["iat"] == int(NOW)
    clock.now += 3600 - 301
    assert await source.token() == "ya29.t1"
    assert len(endpoint.grants) == 1
    clock.now += 1  # inside the 300 s margin
    assert await source.token() == "ya29.t2"
    assert endpoint.grants[1]["iat"] == int(clock.now)
    assert source.exchanges == 2


async def test_concurrent_callers_share_one_exchange() -> None:
    endpoint = TokenEndpoint(delay_s=0.05)
    source = tokens(endpoint, FakeClock())
    results: list[str] = []

    async def ask() -> None:
        results.append(await source.token())

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(ask)
    assert results == ["ya29.t1"] * 20
    assert len(endpoint.grants) == 1


async def test_a_refusal_is_upstream_auth_failed_and_is_retried_next_time() -> None:
    endpoint = TokenEndpoint()
    endpoint.refuse = True
    source = tokens(endpoint, FakeClock())
    with pytest.raises(UpstreamAuthFailed) as caught:
        await source.token()
    assert caught.value.provider == "vtx"
    assert KEY_MARK not in str(caught.value)
    endpoint.refuse = False
    assert await source.token() == "ya29.t2"


async def test_a_failed_refresh_keeps_the_old_token_while_it_lasts() -> None:
    endpoint = TokenEndpoint()
    clock = FakeClock()
    source = tokens(endpoint, clock)
    assert await source.token() == "ya29.t1"
    endpoint.fail = True
    clock.now += 3600 - 100  # due, not expired
    assert await source.token() == "ya29.t1"
    assert len(endpoint.grants) == 2
    # Not retried at once: every request in the margin would wait for its own failure.
    assert await source.token() == "ya29.t1"
    assert len(endpoint.grants) == 2
    clock.now += 11
    assert await source.token() == "ya29.t1"
    assert len(endpoint.grants) == 3
    clock.now += 100  # expired: the failure is the caller's now
    with pytest.raises(UpstreamServerError):
        await source.token()
    endpoint.fail = False
    assert await source.token() == "ya29.t5"  # the fifth grant


async def test_unreachable_and_slow_endpoints() -> None:
    def refuse_connection(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(UpstreamUnreachable, match="cannot connect"):
        await tokens(refuse_connection, FakeClock()).token()

    slow = TokenEndpoint(delay_s=10)
    with trio.move_on_after(5) as outer:  # bounds the test if the deadline did not work
        with pytest.raises(UpstreamUnreachable, match=r"did not answer within 0\.1 s"):
            await tokens(slow, FakeClock(), timeout_s=0.1).token()
    assert not outer.cancelled_caught


async def test_static_token() -> None:
    source = StaticToken(Secret("ya29.given"))
    assert await source.token() == "ya29.given"
    assert "ya29" not in repr(source)


def test_access_token_repr_is_redacted() -> None:
    token = AccessToken(value=Secret("ya29.secret"), expires_at=NOW)
    assert "ya29" not in repr(token)
