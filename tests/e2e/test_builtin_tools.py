"""Built-in (vendor-run) tools on both agent fronts follow the alias's ``builtin_tools``: dropped
(named in ``x-gateway-dropped-tools`` and in the usage record's ``dropped_tools``, each a type
the front knows or "other", never the client's own string), or the request refused in the
front's own error shape (issue 32, item 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import trio

from tests.e2e.harness import Stack, provider_toml, running_gateway, running_sim, script
from tests.e2e.test_usage_ledger import ledger_rows
from trio_gateway.config.load import parse_config

WEATHER: Any = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SERVER_TOOLS: Any = [
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    WEATHER,
    {"type": "bash_20250124", "name": "bash"},
    {"type": "made_up_tool_2099", "name": "x"},
]


def config_text(sim_url: str, ledger: Path, builtin_tools: str) -> str:
    provider = provider_toml("sim-a", sim_url).replace(
        "[[aliases.agent-lite.providers]]",
        f'builtin_tools = "{builtin_tools}"\n[[aliases.agent-lite.providers]]',
        1,
    )
    return (
        '[server]\nlisten = "127.0.0.1:0"\n'
        f'[usage]\nledger = "{ledger}"\nflush_interval_s = 0.05\n'
        f"[aliases.agent-lite]\n{provider}"
    )


async def test_dropped_on_both_fronts_named_in_the_header_and_the_record(tmp_path: Path) -> None:
    ledger = tmp_path / "usage.sqlite3"
    async with running_sim() as sim:
        config = parse_config(
            config_text(sim.base_url, ledger, "drop"),
            source="t.toml",
            environ={"SIM_KEY": "sim-key"},
        )
        async with running_gateway(config) as gateway:
            stack = Stack(sim=sim, gateway=gateway)
            client = anthropic.AsyncAnthropic(
                base_url=gateway.base_url, api_key="unused", max_retries=0
            )
            raw = await client.messages.with_raw_response.create(
                model="agent-lite",
                max_tokens=20,
                tools=SERVER_TOOLS,
                messages=[{"role": "user", "content": script({"text": "hi"})}],
            )
            assert (
                raw.headers["x-gateway-dropped-tools"]
                == "web_search_20250305, bash_20250124, other"
            )
            assert (await raw.parse()).content[0].type == "text"
            sent = (await stack.sim_stats())["last_request_body"]
            assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather"]
            await client.close()
            async with httpx.AsyncClient(timeout=10) as http:
                answer = await http.post(
                    stack.v1 + "/responses",
                    json={
                        "model": "agent-lite",
                        "input": script({"text": "hi"}),
                        "tools": [{"type": "web_search"}, {"type": "file_search"}],
                    },
                )
                assert answer.status_code == 200, answer.text
                assert answer.headers["x-gateway-dropped-tools"] == "web_search, file_search"
                plain = await http.post(
                    stack.v1 + "/messages",
                    json={
                        "model": "agent-lite",
                        "max_tokens": 5,
                        "messages": [{"role": "user", "content": "x"}],
                    },
                )
                assert plain.status_code == 200 and "x-gateway-dropped-tools" not in plain.headers
            with trio.fail_after(5):
                while len(rows := ledger_rows(ledger)) < 3:  # noqa: ASYNC110 - batched writes
                    await trio.sleep(0.02)
    assert [(r["endpoint"], r["dropped_tools"]) for r in rows] == [
        ("messages", "web_search_20250305,bash_20250124,other"),
        ("responses", "web_search,file_search"),
        ("messages", None),
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_refused_on_the_messages_front_in_anthropic_s_shape(
    tmp_path: Path, stream: bool
) -> None:
    async with running_sim() as sim:
        text = config_text(sim.base_url, tmp_path / "u.sqlite3", "refuse")
        config = parse_config(text, source="t.toml", environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as gateway:
            client = anthropic.AsyncAnthropic(
                base_url=gateway.base_url, api_key="unused", max_retries=0
            )
            with pytest.raises(anthropic.BadRequestError) as refused:
                await client.messages.create(
                    model="agent-lite",
                    max_tokens=20,
                    tools=SERVER_TOOLS,
                    stream=stream,
                    messages=[{"role": "user", "content": "hi"}],
                )
            await client.close()
            stats = await Stack(sim=sim, gateway=gateway).sim_stats()
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "web_search_20250305" in body["error"]["message"]
    assert "builtin_tools" in body["error"]["message"]
    assert stats.get("last_request_body") is None  # nothing went upstream
