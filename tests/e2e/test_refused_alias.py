"""A refused request's usage record and access line name the alias it asked for, whenever it
named one the config has: over HTTP, /v1/events and the WebSocket, into a real SQLite ledger
that `trio-gateway usage --by alias` then counts."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio_websocket

from tests.e2e.harness import chat, provider_toml, running_gateway, running_sim
from tests.e2e.test_usage_ledger import cli, ledger_rows
from trio_gateway.config.load import parse_config
from trio_gateway.core.events_codec import TERMINAL_TYPES
from trio_gateway.core.keys import hash_key, new_key

TIMEOUT_S = 20
PRICES = "price_input_per_mtok = 1000.0\nprice_output_per_mtok = 1000.0\n"  # 1e-3 per token
# alice may do anything; bob may use prompt-enhance only; carol has one request a minute; dave
# a budget of one token.
KEYS = {
    "alice": "",
    "bob": 'aliases = ["prompt-enhance"]',
    "carol": "rpm = 1",
    "dave": "budget = 0.001",
}


def gateway_toml(sim_url: str, keys_file: Path, ledger: Path) -> str:
    # prompt-enhance's provider has no capabilities: a request with tools finds none for it.
    lite = provider_toml("sim-a", sim_url, extra=PRICES)
    plain = provider_toml("sim-plain", sim_url, alias="prompt-enhance", capabilities="[]")
    return (
        f'[server]\nlisten = "127.0.0.1:0"\n[auth]\nkeys_file = "{keys_file}"\n'
        f'[usage]\nledger = "{ledger}"\nflush_interval_s = 0.05\n'
        f"[aliases.agent-lite]\n{lite}[aliases.prompt-enhance]\n{plain}"
    )


ROUTES = {
    "chat": "/v1/chat/completions",
    "events": "/v1/events",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
USER = [{"role": "user", "content": "hi"}]


async def test_every_refusal_of_a_named_alias_is_recorded_and_logged_under_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "trio_gateway.access")
    keys = {name: new_key() for name in KEYS}
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(
        "".join(f'[keys.{n}]\nsha256 = "{hash_key(keys[n])}"\n{KEYS[n]}\n' for n in KEYS)
    )
    ledger = tmp_path / "usage.sqlite3"
    # request id → (key, code, the alias its record and access line must name)
    expected: dict[str, tuple[str | None, str | None, str | None]] = {}
    async with running_sim() as sim:
        text = gateway_toml(sim.base_url, keys_file, ledger)
        config = parse_config(text, source="test.toml", environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=TIMEOUT_S) as c:

            async def post(
                who: str | None, body: Any, alias: str | None, code: str | None, path: str = "chat"
            ) -> None:
                headers = {} if who is None else {"authorization": f"Bearer {keys[who]}"}
                url = gateway.base_url + ROUTES[path]
                if isinstance(body, bytes):
                    headers["content-type"] = "application/json"
                    answer = await c.post(url, content=body, headers=headers)
                else:
                    answer = await c.post(url, json=body, headers=headers)
                got = None if answer.status_code == 200 else answer.json()["error"]["code"]
                assert got == code, answer.text
                expected[answer.headers["x-request-id"]] = (who, code, alias)

            lite = "agent-lite"
            await post("alice", chat(max_tokens=4), lite, None)
            # The alias named, then refused: for the key, its limits, its fields, its providers.
            await post("bob", chat(), lite, "alias_not_allowed")
            await post("bob", chat(), lite, "alias_not_allowed", path="events")
            await post("carol", chat(max_tokens=4), lite, None)
            await post("carol", chat(max_tokens=4), lite, "rate_limited")
            await post("dave", chat(max_tokens=1000), lite, "budget_exceeded")
            await post("alice", {"model": lite, "messages": "hi"}, lite, "invalid_request")
            await post("alice", chat(n=2), lite, "unsupported_parameter")
            # The other OpenAI endpoints take the same path to their refusals.
            completion = {"model": lite, "prompt": "hi"}
            await post("bob", completion, lite, "alias_not_allowed", path="completions")
            await post("alice", {"model": lite, "input": 42}, lite, "invalid_request", "embeddings")
            await post(
                "alice",
                {"model": "prompt-enhance", "messages": USER, "tools": TOOLS},
                "prompt-enhance",
                "capability_unavailable",
            )
            # No alias: none named, or a name the config does not have, or no body read.
            await post("alice", chat(model="no-such-alias"), None, "model_not_found")
            await post("bob", chat(model="no-such-alias"), None, "alias_not_allowed")
            await post("alice", b'{"model": "agent-lite", ', None, "invalid_json")
            await post("alice", {"messages": USER}, None, "invalid_request")
            await post("alice", {"model": 42, "messages": USER}, None, "invalid_request")
            await post("alice", [lite], None, "invalid_request")
            await post(None, chat(), None, "invalid_api_key")

            # The WebSocket: each refused message's error event names its request id.
            ws_url = gateway.base_url.replace("http://", "ws://") + "/v1/ws?access_token="
            for who, body, alias, code in [
                ("bob", chat(), lite, "alias_not_allowed"),
                ("carol", chat(), lite, "rate_limited"),
                ("dave", chat(max_tokens=1000), lite, "budget_exceeded"),
                ("alice", {"model": lite, "messages": []}, lite, "invalid_request"),
                ("alice", chat(model="no-such-alias"), None, "model_not_found"),
            ]:
                async with trio_websocket.open_websocket_url(ws_url + keys[who]) as ws:
                    message = {"type": "request", "id": "r1", "body": body}
                    await ws.send_message(json.dumps(message))
                    while (event := json.loads(await ws.get_message()))["type"] not in (
                        TERMINAL_TYPES
                    ):
                        pass
                assert (event["type"], event["code"]) == ("error", code)
                expected[event["request_id"]] = (who, code, alias)

    records = {r["request_id"]: r for r in ledger_rows(ledger)}
    lines = {
        line["request_id"]: line
        for line in (dict(r.__dict__["access"]) for r in caplog.records if hasattr(r, "access"))
    }
    assert set(records) == set(expected)
    for request_id, want in expected.items():
        record, line = records[request_id], lines[request_id]
        assert (record["key"], record["error_code"], record["alias"]) == want, record
        assert (line["key"], line["code"], line["alias"]) == want, line
        assert record["outcome"] == ("completed" if want[1] is None else "refused")

    # usage --by alias counts the refusals under their alias now, and the rest under "-".
    with trio.fail_after(TIMEOUT_S):
        table = await cli(["usage", "--ledger", str(ledger), "--by", "alias"])
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    # requests, completed, cancelled, failed, refused
    assert rows["agent-lite"][1:6] == ["14", "2", "0", "0", "12"]
    assert rows["prompt-enhance"][1:6] == ["1", "0", "0", "0", "1"]
    assert rows["-"][1:6] == ["8", "0", "0", "0", "8"]
