"""API keys end to end: a real gateway with a keys file, over HTTP, the SDK and WebSocket."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import openai
import pytest
import trio
import trio_websocket

from tests.e2e.harness import (
    Stack,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
)
from tests.e2e.test_cli import CLI, REPO
from trio_gateway.cli.keys import write_atomically
from trio_gateway.config.load import parse_config
from trio_gateway.core.events_codec import TERMINAL_TYPES
from trio_gateway.core.keys import hash_key, new_key

TIMEOUT_S = 20


@attrs.frozen
class Keyed:
    stack: Stack
    keys_file: Path
    keys: dict[str, str]  # name → the key itself

    @property
    def v1(self) -> str:
        return self.stack.v1

    def ws_url(self, query: str = "") -> str:
        return self.stack.gateway.base_url.replace("http://", "ws://") + "/v1/ws" + query


def keys_toml(keys: dict[str, str], aliases: dict[str, list[str]] | None = None) -> str:
    out = []
    for name, key in keys.items():
        out.append(f'[keys.{name}]\nsha256 = "{hash_key(key)}"')
        if aliases and name in aliases:
            out.append(f"aliases = {json.dumps(aliases[name])}")
    return "\n".join(out) + "\n"


# alice may use every alias, bob only prompt-enhance.
BOB_ALIASES = {"bob": ["prompt-enhance"]}


@asynccontextmanager
async def keyed_stack(tmp_path: Path, *, max_inflight: int = 8) -> AsyncIterator[Keyed]:
    keys = {"alice": new_key(), "bob": new_key()}
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(keys_toml(keys, BOB_ALIASES))
    async with running_sim() as sim:
        providers = [
            provider_toml("sim-a", sim.base_url, alias=alias, max_inflight=max_inflight)
            for alias in ("agent-lite", "prompt-enhance")
        ]
        text = (
            f'[server]\nlisten = "127.0.0.1:0"\n[auth]\nkeys_file = "{keys_file}"\n'
            f"[aliases.agent-lite]\n{providers[0]}[aliases.prompt-enhance]\n{providers[1]}"
        )
        config = parse_config(text, source="test.toml", environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as gateway:
            yield Keyed(stack=Stack(sim=sim, gateway=gateway), keys_file=keys_file, keys=keys)


@pytest.fixture
async def keyed(tmp_path: Path) -> AsyncIterator[Keyed]:
    async with keyed_stack(tmp_path) as k:
        yield k


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_api_key"
    assert set(error) == {"message", "type", "code", "param"}


async def test_http_needs_a_known_key_and_the_probes_do_not(keyed: Keyed) -> None:
    alice, bob = keyed.keys["alice"], keyed.keys["bob"]
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        for path in ("/chat/completions", "/events"):
            assert_401(await client.post(keyed.v1 + path, json=chat(max_tokens=4)))
            assert_401(
                await client.post(
                    keyed.v1 + path, json=chat(max_tokens=4), headers=bearer("tgw-wrong")
                )
            )
            assert_401(
                await client.post(
                    keyed.v1 + path, json=chat(max_tokens=4), headers={"authorization": alice}
                )
            )
            ok = await client.post(keyed.v1 + path, json=chat(max_tokens=4), headers=bearer(alice))
            assert ok.status_code == 200, ok.text
        refused = await client.post(
            keyed.v1 + "/chat/completions", json=chat(max_tokens=4), headers=bearer(bob)
        )
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert (error["code"], error["type"], error["param"]) == (
            "alias_not_allowed",
            "invalid_request_error",
            "model",
        )
        # A restricted key learns its own aliases, not the gateway's.
        assert "prompt-enhance" in error["message"] and "agent-lite" in error["message"]
        unknown = await client.post(
            keyed.v1 + "/chat/completions",
            json=chat(max_tokens=4, model="secret-alias"),
            headers=bearer(bob),
        )
        assert unknown.status_code == 403
        own = await client.post(
            keyed.v1 + "/chat/completions",
            json=chat(max_tokens=4, model="prompt-enhance"),
            headers=bearer(bob),
        )
        assert own.status_code == 200, own.text
        assert own.json()["model"] == "prompt-enhance"
        # The probes need no key (and say only ready or not); the metrics need an admin key
        # (tests/e2e/test_status_auth.py).
        for path in ("/healthz", "/readyz"):
            response = await client.get(keyed.stack.gateway.base_url + path)
            assert response.status_code == 200, path


async def test_models_lists_only_the_aliases_of_the_key(keyed: Keyed) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        assert_401(await client.get(keyed.v1 + "/models"))

        async def ids(key: str) -> list[str]:
            response = await client.get(keyed.v1 + "/models", headers=bearer(key))
            assert response.status_code == 200
            return [m["id"] for m in response.json()["data"]]

        assert await ids(keyed.keys["alice"]) == ["agent-lite", "prompt-enhance"]
        assert await ids(keyed.keys["bob"]) == ["prompt-enhance"]
        # One model: a key learns nothing of an alias it may not use.
        assert_401(await client.get(keyed.v1 + "/models/agent-lite"))
        one = await client.get(keyed.v1 + "/models/agent-lite", headers=bearer(keyed.keys["alice"]))
        assert (one.status_code, one.json()["id"]) == (200, "agent-lite")
        hidden = await client.get(
            keyed.v1 + "/models/agent-lite", headers=bearer(keyed.keys["bob"])
        )
        assert hidden.status_code == 404
        assert hidden.json()["error"]["code"] == "model_not_found"


async def test_the_openai_sdk_with_a_good_key_a_bad_key_and_a_forbidden_alias(
    keyed: Keyed,
) -> None:
    def run(key: str, model: str = "agent-lite") -> str:
        client = openai.OpenAI(base_url=keyed.v1, api_key=key, max_retries=0, timeout=TIMEOUT_S)
        text = []
        for chunk in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=8
        ):
            for c in chunk.choices:
                text.append(c.delta.content or getattr(c.delta, "reasoning_content", "") or "")
        return "".join(text)

    assert (await trio.to_thread.run_sync(run, keyed.keys["alice"])).strip()
    with pytest.raises(openai.AuthenticationError) as bad:
        await trio.to_thread.run_sync(run, "tgw-not-a-key")
    assert bad.value.code == "invalid_api_key"
    with pytest.raises(openai.PermissionDeniedError) as forbidden:
        await trio.to_thread.run_sync(run, keyed.keys["bob"])
    assert forbidden.value.code == "alias_not_allowed"


async def ws_round_trip(
    ws: trio_websocket.WebSocketConnection, id: str, model: str
) -> list[dict[str, Any]]:
    body = chat(max_tokens=4, model=model)
    await ws.send_message(json.dumps({"type": "request", "id": id, "body": body}))
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] not in TERMINAL_TYPES:
        event = json.loads(await ws.get_message())
        if event.get("id") == id:
            events.append(event)
    return events


async def test_websocket_takes_the_key_from_a_header_a_subprotocol_or_the_query(
    keyed: Keyed,
) -> None:
    alice = keyed.keys["alice"]
    ways: list[tuple[str, dict[str, Any], str | None]] = [
        ("header", {"extra_headers": [(b"authorization", f"Bearer {alice}".encode())]}, None),
        ("subprotocol", {"subprotocols": ["trio-gateway", f"bearer.{alice}"]}, "trio-gateway"),
        ("query", {}, None),
    ]
    with trio.fail_after(TIMEOUT_S):
        for way, kwargs, subprotocol in ways:
            url = keyed.ws_url(f"?access_token={alice}" if way == "query" else "")
            async with trio_websocket.open_websocket_url(url, **kwargs) as ws:
                assert ws.subprotocol == subprotocol, way
                events = await ws_round_trip(ws, way, "agent-lite")
                assert events[-1]["type"] == "response.done", (way, events)


async def test_websocket_refuses_a_bad_key_at_the_handshake(keyed: Keyed) -> None:
    with trio.fail_after(TIMEOUT_S):
        attempts: list[tuple[str, dict[str, Any], int]] = [
            ("", {}, 401),
            ("", {"extra_headers": [(b"authorization", b"Bearer tgw-wrong")]}, 401),
            ("", {"subprotocols": ["trio-gateway", "bearer.tgw-wrong"]}, 401),
            ("?access_token=tgw-wrong", {}, 401),
            # A key as the only subprotocol would have to be echoed: refused instead.
            ("", {"subprotocols": [f"bearer.{keyed.keys['alice']}"]}, 400),
        ]
        for query, kwargs, status in attempts:
            with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
                async with trio_websocket.open_websocket_url(keyed.ws_url(query), **kwargs):
                    pass
            assert rejected.value.status_code == status, (query, kwargs)
            assert rejected.value.body is not None
            error = json.loads(rejected.value.body)["error"]
            assert error["code"] == ("invalid_api_key" if status == 401 else "invalid_request")
            assert keyed.keys["alice"].encode() not in rejected.value.body
            if status == 401:
                assert (b"www-authenticate", b'Bearer realm="trio-gateway"') in (
                    rejected.value.headers
                )


async def test_websocket_refuses_an_alias_per_request_and_goes_on(keyed: Keyed) -> None:
    bob = keyed.keys["bob"]
    with trio.fail_after(TIMEOUT_S):
        async with trio_websocket.open_websocket_url(
            keyed.ws_url(), extra_headers=[(b"authorization", f"Bearer {bob}".encode())]
        ) as ws:
            refused = await ws_round_trip(ws, "r1", "agent-lite")
            assert [e["type"] for e in refused] == ["error"]
            assert refused[0]["code"] == "alias_not_allowed"
            assert refused[0]["request_id"] is not None
            served = await ws_round_trip(ws, "r2", "prompt-enhance")
            assert served[-1]["type"] == "response.done"


async def ok_status(client: httpx.AsyncClient, keyed: Keyed, key: str) -> int:
    response = await client.get(keyed.v1 + "/models", headers=bearer(key))
    return response.status_code


async def test_a_changed_keys_file_takes_effect_without_a_restart(
    keyed: Keyed, caplog: pytest.LogCaptureFixture
) -> None:
    carol = new_key()
    alice = keyed.keys["alice"]
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        assert await ok_status(client, keyed, carol) == 401
        # Rotation: carol in, alice out, in one rename.
        write_atomically(
            keyed.keys_file, keys_toml({"bob": keyed.keys["bob"], "carol": carol}, BOB_ALIASES)
        )
        # The gateway looks at the file at most once a second; nothing announces the reload.
        with trio.fail_after(TIMEOUT_S):
            while await ok_status(client, keyed, carol) != 200:  # noqa: ASYNC110 - no event
                await trio.sleep(0.05)
        assert await ok_status(client, keyed, alice) == 401
        # A broken file leaves the keys as they were; the log says why, once the next request
        # has looked at the file.
        with caplog.at_level(logging.ERROR, logger="trio_gateway"), trio.fail_after(TIMEOUT_S):
            keyed.keys_file.write_text("[keys.dave]\nsha256 = 3\n")
            while not any("keys.dave.sha256" in r.getMessage() for r in caplog.records):
                assert await ok_status(client, keyed, carol) == 200
                await trio.sleep(0.05)
        assert await ok_status(client, keyed, alice) == 401


async def test_fifty_concurrent_requests_with_valid_keys_while_the_file_changes(
    tmp_path: Path,
) -> None:
    async with keyed_stack(tmp_path, max_inflight=64) as keyed:
        keys = keyed.stack.gateway.app.keys
        assert keys is not None
        keys.check_interval_s = 0  # every request looks at the file
        statuses: list[int] = []
        stop_rewriting = trio.Event()

        async def one(i: int, client: httpx.AsyncClient) -> None:
            name, model = ("alice", "agent-lite") if i % 2 else ("bob", "prompt-enhance")
            response = await client.post(
                keyed.v1 + "/chat/completions",
                json=chat(max_tokens=4, model=model),
                headers=bearer(keyed.keys[name]),
            )
            statuses.append(response.status_code)

        async def rewrite() -> None:
            extra = 0
            while not stop_rewriting.is_set():
                extra += 1
                more = {**keyed.keys, **{f"extra{n}": new_key() for n in range(extra % 5)}}
                write_atomically(keyed.keys_file, keys_toml(more, BOB_ALIASES))
                await trio.sleep(0.01)

        limits = httpx.Limits(max_connections=60)
        with trio.fail_after(60):
            async with (
                httpx.AsyncClient(timeout=60, limits=limits) as client,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(rewrite)
                async with trio.open_nursery() as requests:
                    for i in range(50):
                        requests.start_soon(one, i, client)
                stop_rewriting.set()
        assert statuses == [200] * 50


async def test_no_key_appears_in_a_log_line_or_a_response(
    keyed: Keyed, caplog: pytest.LogCaptureFixture
) -> None:
    alice, bob = keyed.keys["alice"], keyed.keys["bob"]
    wrong = "tgw-" + "w" * 43
    bodies: list[bytes] = []
    with caplog.at_level(logging.DEBUG):
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            for key in (alice, bob, wrong):
                for path in ("/chat/completions", "/events"):
                    response = await client.post(
                        keyed.v1 + path, json=chat(max_tokens=4), headers=bearer(key)
                    )
                    bodies.append(response.content + str(response.headers).encode())
                response = await client.get(keyed.v1 + "/models", headers=bearer(key))
                bodies.append(response.content + str(response.headers).encode())
        with trio.fail_after(TIMEOUT_S):
            for key in (alice, bob, wrong):
                ways: list[tuple[str, dict[str, Any]]] = [
                    (f"?access_token={key}", {}),
                    ("", {"subprotocols": ["trio-gateway", f"bearer.{key}"]}),
                    ("", {"subprotocols": [f"bearer.{key}"]}),
                ]
                for query, kwargs in ways:
                    try:
                        async with trio_websocket.open_websocket_url(
                            keyed.ws_url(query), **kwargs
                        ) as ws:
                            events = await ws_round_trip(ws, "r", "agent-lite")
                            bodies.append(json.dumps(events).encode())
                    except trio_websocket.ConnectionRejected as exc:
                        bodies.append((exc.body or b"") + repr(exc.headers).encode())
    # The gateway's side: the clients' own loggers (trio-websocket logs the URL it connects
    # to, query and all) are not the gateway's to judge.
    clients = ("trio-websocket", "httpx", "httpcore", "openai")
    records = [r for r in caplog.records if not r.name.startswith(clients)]
    text = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in records)
    text += "\n".join(map(repr, bodies))
    # The gateway did log, about keys too: the check below is not vacuous.
    assert any("refusing a websocket: invalid_api_key" in r.getMessage() for r in records)
    for key in (alice, bob, wrong):
        assert key not in text
        assert key[len("tgw-") :] not in text
    assert hash_key(alice) not in text


async def test_the_start_up_line_says_whether_auth_is_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="trio_gateway"):
        async with keyed_stack(tmp_path):
            pass
    keys_file = tmp_path / "keys.toml"
    assert f"auth: 2 keys from {keys_file}" in caplog.messages
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trio_gateway"):
        async with running_sim() as sim:
            config = gateway_config(provider_toml("sim-a", sim.base_url))
            async with running_gateway(config):
                pass
    [line] = [m for m in caplog.messages if m.startswith("auth: ")]
    assert line.startswith("auth: OPEN (no keys file)")
    assert "127.0.0.1:0 is loopback" in line


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=30, env={**os.environ}, cwd=REPO
    )


def test_the_keys_cli_prints_a_key_once_and_stores_only_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    made = run_cli(
        "keys", "new", "alice", "--keys-file", str(path), "--aliases", "agent-lite,prompt-enhance"
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.splitlines()[-1]
    assert key.startswith("tgw-") and len(key) == 47 and " " not in key
    assert made.stdout.count(key) == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = run_cli(
        "keys", "new", "bob", "--keys-file", str(path), "--rpm", "60", "--tpm", "1000",
        "--budget", "2.5",
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    bob = second.stdout.splitlines()[-1]
    stored = path.read_text()
    assert key not in stored and bob not in stored
    assert hash_key(key) in stored and hash_key(bob) in stored
    assert 'aliases = ["agent-lite", "prompt-enhance"]' in stored
    assert "rpm = 60\ntpm = 1000\nbudget = 2.5\n" in stored

    listed = run_cli("keys", "list", "--keys-file", str(path))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        "alice  (aliases: agent-lite, prompt-enhance; rpm: -; tpm: -; budget: -)",
        "bob  (aliases: all; rpm: 60; tpm: 1000; budget: 2.5; period: none)",
    ]
    for secret in (key, bob, hash_key(key), hash_key(bob)):
        assert secret not in listed.stdout + listed.stderr

    duplicate = run_cli("keys", "new", "alice", "--keys-file", str(path))
    assert duplicate.returncode == 2
    assert "a key named 'alice' already exists" in duplicate.stderr
    assert duplicate.stdout == ""
    assert path.read_text() == stored

    bad = run_cli("keys", "new", "bad name", "--keys-file", str(path))
    assert bad.returncode == 2 and path.read_text() == stored

    # The file it writes is one `check` accepts, with the repo's aliases.
    config = tmp_path / "gateway.toml"
    text = (REPO / "gateway.toml").read_text()
    config.write_text(text.replace("open = true", f'keys_file = "{path}"'))
    checked = run_cli("check", str(config))
    assert checked.returncode == 0, checked.stderr


def test_keys_list_of_a_missing_or_broken_file(tmp_path: Path) -> None:
    missing = run_cli("keys", "list", "--keys-file", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[keys.a]\nrpm = 0\n")
    listed = run_cli("keys", "list", "--keys-file", str(broken))
    assert listed.returncode == 2
    assert f"{broken}: keys.a.sha256: required field missing" in listed.stderr
    assert f"{broken}: keys.a.rpm: must be at least 1" in listed.stderr
    # keys new does not add to a broken file.
    made = run_cli("keys", "new", "b", "--keys-file", str(broken))
    assert made.returncode == 2 and broken.read_text() == "[keys.a]\nrpm = 0\n"
