"""The gateway behind an egress proxy and TLS inspection, end to end: its providers are
reached only through the proxy (tests/connect_proxy.py records every CONNECT), over TLS
signed by a private CA the provider's ``ca_file`` (or ``SSL_CERT_FILE``) names, the Vertex
token exchange (a token endpoint of the same CA) included; ``NO_PROXY`` goes direct, and an
unknown CA is refused by name."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from tests.connect_proxy import Seen, connect_proxy, tls_front
from tests.e2e.harness import FAST_SIM, chat, running_gateway, script
from tests.e2e.test_cloud_providers import key_pair
from tests.unit.test_h1_client_tls import make_ca_and_server
from trio_gateway.config.load import parse_config
from trio_gateway.sim import SimHandle, serve_sim


@attrs.define
class Vertex:
    sim: SimHandle
    front: str
    token_url: str
    proxy: str
    seen: Seen
    account: Path
    ca: Path
    grants: int = 0


@asynccontextmanager
async def token_endpoint(
    context: ssl.SSLContext, granted: Callable[[], None]
) -> AsyncIterator[str]:
    """Google's OAuth2 token endpoint, as far as a grant goes: any grant, one token."""

    async def serve(stream: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
            granted()
            body = json.dumps({"access_token": "ya29.t", "expires_in": 3600}).encode()
            head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            await stream.send_all(head.encode() + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # a client that refused the certificate
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_ssl_over_tcp, serve, 0, context, host="127.0.0.1")
        )
        port = listeners[0].transport_listener.socket.getsockname()[1]
        yield f"https://localhost:{port}/token"
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def vertex_behind_a_proxy(tmp_path: Path) -> AsyncIterator[Vertex]:
    """A Vertex AI simulator and a token endpoint behind TLS of a private CA, and a proxy."""
    private, _ = key_pair()
    sim_config = attrs.evolve(FAST_SIM, dialect="gemini", api_key=None)
    ca, context = make_ca_and_server(tmp_path)
    account = tmp_path / "sa.json"
    holder: list[Vertex] = []

    def granted() -> None:
        holder[0].grants += 1

    async with trio.open_nursery() as nursery:
        sim: SimHandle = await nursery.start(serve_sim, sim_config)
        port = int(sim.base_url.rsplit(":", 1)[1])
        async with (
            tls_front(context, port) as front,
            token_endpoint(context, granted) as token_url,
            connect_proxy() as (proxy, seen),
        ):
            account.write_text(
                json.dumps(
                    {
                        "type": "service_account",
                        "client_email": "gateway@project.iam.gserviceaccount.com",
                        "private_key_id": "k1",
                        "private_key": private,
                        "token_uri": token_url,
                    }
                )
            )
            holder.append(Vertex(sim, front, token_url, proxy, seen, account, ca))
            yield holder[0]
        nursery.cancel_scope.cancel()


def vertex_config(v: Vertex, extra: str = "") -> str:
    return f"""
[server]
listen = "127.0.0.1:0"
[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "vertex"
type = "vertex"
base_url = "{v.front}"
project = "my-project"
location = "europe-west4"
model = "qwen3-32b"
credentials_file = "{v.account}"
probe = false
{extra}
"""


async def ask(text: str) -> httpx.Response:
    config = parse_config(text, source="test.toml", environ={})
    async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=10) as client:
        return await client.post(
            gateway.base_url + "/v1/chat/completions", json=chat(script({"text": "through"}))
        )


async def test_chat_and_token_go_through_the_proxy_trusting_the_ca_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with vertex_behind_a_proxy(tmp_path) as v:
        monkeypatch.setenv("HTTPS_PROXY", v.proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        response = await ask(vertex_config(v, f'ca_file = "{v.ca}"'))
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "through"
        assert v.grants == 1
        # The token exchange (httpx) and the chat (the gateway's own client): both tunnelled.
        chat_at = v.front.removeprefix("https://")
        token_at = v.token_url.removeprefix("https://").removesuffix("/token")
        assert sorted(v.seen.lines) == sorted(
            [f"CONNECT {chat_at} HTTP/1.1", f"CONNECT {token_at} HTTP/1.1"]
        )


async def test_ssl_cert_file_is_the_trust_of_chat_and_token_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with vertex_behind_a_proxy(tmp_path) as v:
        monkeypatch.setenv("HTTPS_PROXY", v.proxy)
        monkeypatch.setenv("SSL_CERT_FILE", str(v.ca))
        response = await ask(vertex_config(v))
        assert response.status_code == 200, response.text
        assert v.grants == 1
        assert len(v.seen.lines) == 2


async def test_no_proxy_goes_direct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with vertex_behind_a_proxy(tmp_path) as v:
        monkeypatch.setenv("HTTPS_PROXY", v.proxy)
        monkeypatch.setenv("NO_PROXY", "localhost")
        response = await ask(vertex_config(v, f'ca_file = "{v.ca}"'))
        assert response.status_code == 200, response.text
        assert v.seen.lines == []


async def test_an_unknown_ca_is_refused_at_the_token_step_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "other").mkdir()
    other_ca, _ = make_ca_and_server(tmp_path / "other")
    async with vertex_behind_a_proxy(tmp_path) as v:
        monkeypatch.setenv("HTTPS_PROXY", v.proxy)
        # SSL_CERT_FILE trusts the simulator's CA, but the provider's ca_file comes first.
        monkeypatch.setenv("SSL_CERT_FILE", str(v.ca))
        response = await ask(vertex_config(v, f'ca_file = "{other_ca}"'))
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert "certificate" in error["message"].lower(), error
        assert v.grants == 0
        assert v.sim.engine.stats().requests == 0
