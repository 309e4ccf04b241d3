"""The oauth2 token endpoint's answer (``providers/vertex_auth.parse_token_response``): each
outcome's exact error, type and message, by table.

Written for mutation testing (docs/testing.md): an operator reads these messages in the log.
"""

from __future__ import annotations

import pytest

from trio_gateway.config.schema import Secret
from trio_gateway.core.errors import UpstreamAuthFailed, UpstreamProtocolError, UpstreamServerError
from trio_gateway.providers.gemini.vertex_auth import AccessToken, parse_token_response

REFUSED = "vtx: the oauth2 token endpoint refused the service account's grant"
FAILED = "vtx: the oauth2 token endpoint failed"


@pytest.mark.parametrize(
    ("status", "body", "error", "message"),
    [
        (429, b"", UpstreamServerError, f"{FAILED} (HTTP 429, (empty body))"),
        (500, b" busy ", UpstreamServerError, f"{FAILED} (HTTP 500, busy)"),
        (499, b"", UpstreamAuthFailed, f"{REFUSED} (HTTP 499, (empty body))"),
        (
            400,
            b'{"error": "invalid_grant", "error_description": "bad sig"}',
            UpstreamAuthFailed,
            f"{REFUSED} (HTTP 400, invalid_grant: bad sig)",
        ),
        (
            401,
            b'{"error": "invalid_grant", "error_description": ""}',
            UpstreamAuthFailed,
            f"{REFUSED} (HTTP 401, invalid_grant)",
        ),
        (
            403,
            b'{"error": "x", "error_description": 5}',
            UpstreamAuthFailed,
            f"{REFUSED} (HTTP 403, x)",
        ),
        (
            403,
            b'{"error": 5}',
            UpstreamAuthFailed,
            f'{REFUSED} (HTTP 403, {{"error": 5}})',
        ),
        (
            201,
            b"\xff",
            UpstreamAuthFailed,
            f"{REFUSED} (HTTP 201, \ufffd)",
        ),
        (
            200,
            b"nope",
            UpstreamProtocolError,
            "vtx: the oauth2 token endpoint answered 200 without an access_token",
        ),
        (
            200,
            b'{"access_token": ""}',
            UpstreamProtocolError,
            "vtx: the oauth2 token endpoint answered 200 without an access_token",
        ),
        (
            200,
            b'{"access_token": "t"}',
            UpstreamProtocolError,
            "vtx: the oauth2 token endpoint answered without a valid expires_in",
        ),
        (
            200,
            b'{"access_token": "t", "expires_in": true}',
            UpstreamProtocolError,
            "vtx: the oauth2 token endpoint answered without a valid expires_in",
        ),
        (
            200,
            b'{"access_token": "t", "expires_in": 0}',
            UpstreamProtocolError,
            "vtx: the oauth2 token endpoint answered without a valid expires_in",
        ),
        (
            200,
            b'{"access_token": "t", "expires_in": "60"}',
            UpstreamProtocolError,
            "vtx: the oauth2 token endpoint answered without a valid expires_in",
        ),
    ],
)
def test_each_answer_of_the_token_endpoint(
    status: int, body: bytes, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        parse_token_response(status, body, now=100.0, provider="vtx")
    assert str(caught.value) == message
    assert getattr(caught.value, "provider", None) == "vtx"


def test_without_a_provider_name_the_message_has_no_prefix() -> None:
    with pytest.raises(UpstreamServerError) as caught:
        parse_token_response(503, b"", now=0.0)
    assert str(caught.value) == "the oauth2 token endpoint failed (HTTP 503, (empty body))"


@pytest.mark.parametrize(("lifetime", "expires_at"), [("60", 160.0), ("0.5", 100.5)])
def test_a_token_and_when_it_expires(lifetime: str, expires_at: float) -> None:
    body = f'{{"access_token": "t", "expires_in": {lifetime}}}'.encode()
    assert parse_token_response(200, body, now=100.0) == AccessToken(
        value=Secret("t"), expires_at=expires_at
    )
