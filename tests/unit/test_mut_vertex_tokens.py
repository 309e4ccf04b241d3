"""The service-account key file, the JWT's encoding and the token source's exchanges
(``providers/vertex_auth.py``): what an operator reads and what Google is sent.

Written for mutation testing (docs/testing.md), next to ``test_mut_vertex_auth.py`` (the token
endpoint's answers).
"""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from tests.unit.test_vertex_auth import (
    KEY_FILE,
    FakeClock,
    TokenEndpoint,
    tokens,
)
from trio_gateway.config.schema import Secret
from trio_gateway.core.errors import UpstreamUnreachable
from trio_gateway.providers.gemini.vertex_auth import (
    AccessToken,
    ServiceAccount,
    _b64url,
    _json_segment,
)


def test_the_key_file_s_fields_are_kept() -> None:
    account = ServiceAccount.from_json(json.dumps(KEY_FILE), source="sa.json")
    assert account.client_email == "gateway@my-project.iam.gserviceaccount.com"
    assert account.private_key_id == "kid-123"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "sa.json: not a JSON service-account key file"),
        ("[]", "sa.json: not a JSON service-account key file"),
        (
            json.dumps({**KEY_FILE, "type": "x" * 50}),
            f"sa.json: credentials of type {'x' * 40!r} are not a service account "
            '(expected "type": "service_account")',
        ),
    ],
)
def test_key_file_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        ServiceAccount.from_json(text, source="sa.json")
    assert str(caught.value) == message


def test_jwt_segments_are_compact_and_unpadded() -> None:
    assert _b64url(b"\x00\x00\x17") == "AAAX"
    assert _b64url(b"\xff") == "_w"
    assert _json_segment({"a": 1, "b": "c"}) == _b64url(b'{"a":1,"b":"c"}')


def test_a_token_is_expired_at_its_expiry() -> None:
    token = AccessToken(value=Secret("t"), expires_at=100.0)
    assert not token.expired(99.9)
    assert token.expired(100.0)


async def test_the_grant_asks_for_the_configured_scope() -> None:
    endpoint = TokenEndpoint()
    source = tokens(endpoint, FakeClock(), scope="https://example.test/scope")
    await source.token()
    assert endpoint.grants[0]["scope"] == "https://example.test/scope"


async def test_a_token_due_for_refresh_is_refreshed_from_the_first_second() -> None:
    endpoint = TokenEndpoint(lifetime_s=100)
    clock = FakeClock(0.0)
    source = tokens(endpoint, clock)
    assert await source.token() == "ya29.t1"
    clock.now = 0.5  # inside the refresh margin, never failed: refreshed
    assert await source.token() == "ya29.t2"


async def test_a_failed_refresh_is_retried_when_the_pause_is_over() -> None:
    endpoint = TokenEndpoint()
    clock = FakeClock()
    source = tokens(endpoint, clock)
    await source.token()
    endpoint.fail = True
    clock.now += 3600 - 100
    assert await source.token() == "ya29.t1"
    clock.now += 10  # exactly the pause after a failure
    assert await source.token() == "ya29.t1"
    assert len(endpoint.grants) == 3


async def test_exchange_failures_name_the_provider() -> None:
    def refuse_connection(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(UpstreamUnreachable) as caught:
        await tokens(refuse_connection, FakeClock()).token()
    assert caught.value.provider == "vtx"


async def test_a_slow_exchange_names_the_provider(autojump_clock: trio.abc.Clock) -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    with pytest.raises(UpstreamUnreachable) as caught:
        await tokens(hang, FakeClock(), timeout_s=2).token()
    assert caught.value.message == "vtx: the oauth2 token endpoint did not answer within 2 s"
    assert caught.value.provider == "vtx"
