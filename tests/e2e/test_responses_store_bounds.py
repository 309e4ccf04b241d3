"""Stored responses stay bounded and linear (issue 39, items 2 and 6): a chained turn stores its
own items once, not the conversation again; input the gateway dropped is not stored; a record
past ``[responses] max_record_bytes`` is not stored and the answer says so; a failed response is
never stored."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import httpx
import openai

from tests.e2e.harness import (
    FAST_SIM,
    Stack,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)
from trio_gateway.accounting.response_store import RESPONSES_FILE
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import GatewayConfig

TIMEOUT_S = 10
TURNS = 50
TURN_BYTES = 2048
SAID = script({"text": "ok"})
STORED_HEADER = "x-gateway-response-stored"
# Room for fifty turns of 256 tokens, and no time spent on them.
ROOMY_SIM = attrs.evolve(
    FAST_SIM, max_model_len=32768, prefill_s_per_token=0.0, decode_step_s=0.0002
)


def config_with_ledger(tmp_path: Path, sim_url: str, responses: str = "") -> GatewayConfig:
    ledger = tmp_path / "usage.sqlite3"
    text = (
        f'[server]\nlisten = "127.0.0.1:0"\n[usage]\nledger = "{ledger}"\n'
        f"{responses}[aliases.agent-lite]\n{provider_toml('sim-a', sim_url)}"
    )
    return parse_config(text, source="t.toml", environ={"SIM_KEY": "sim-key"})


def stored_bytes(path: Path) -> int:
    """The bytes of the file's pages in use, once its write-ahead log is folded in."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size: int = conn.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * size)
    finally:
        conn.close()


def record_bytes(path: Path) -> int:
    """What the records themselves hold, every key's."""
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT SUM(bytes) FROM response_records").fetchone()[0])
    finally:
        conn.close()


def turn_text(turn: int) -> str:
    head = f"turn {turn}: "
    return head + "x" * (TURN_BYTES - len(head) - len(SAID)) + SAID


async def test_fifty_chained_turns_store_each_turn_once(tmp_path: Path) -> None:
    async with (
        running_sim(ROOMY_SIM) as sim,
        running_gateway(config_with_ledger(tmp_path, sim.base_url)) as gateway,
    ):
        stack = Stack(sim=sim, gateway=gateway)
        client = openai.AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
        previous: str | None = None
        for turn in range(TURNS):
            made = await client.responses.create(
                model="agent-lite", input=turn_text(turn), previous_response_id=previous
            )
            assert made.output_text == "ok"
            previous = made.id
        await client.close()
        sent = (await stack.sim_stats())["last_request_body"]
    # The chain walked back to the first turn: every turn reached the model, in order.
    users = [m["content"] for m in sent["messages"] if m["role"] == "user"]
    assert users == [turn_text(turn) for turn in range(TURNS)]
    size = stored_bytes(tmp_path / RESPONSES_FILE)
    records = record_bytes(tmp_path / RESPONSES_FILE)
    said = TURNS * TURN_BYTES
    print(
        f"{TURNS} chained turns of {TURN_BYTES} B ({said} B said): records {records} B "
        f"({records / said:.2f} x), the file's pages {size} B ({size / said:.2f} x)"
    )
    # Each turn once, with its response object (~1 KB) and the file's pages: a few times what
    # was said, where a copy of the conversation per turn is TURNS / 2 times it (3.0 MB).
    assert records < 2 * said
    assert size < 3 * said


async def test_dropped_input_is_not_stored(tmp_path: Path) -> None:
    search: Any = {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "q" * 1024 * 1024},
    }
    async with (
        running_sim() as sim,
        running_gateway(config_with_ledger(tmp_path, sim.base_url)) as gateway,
    ):
        client = openai.AsyncOpenAI(
            base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0
        )
        previous: str | None = None
        for _ in range(3):
            made = await client.responses.create(
                model="agent-lite",
                input=[search, {"role": "user", "content": SAID}],
                previous_response_id=previous,
            )
            previous = made.id
        await client.close()
    assert stored_bytes(tmp_path / RESPONSES_FILE) < 64 * 1024


async def test_a_record_past_the_limit_is_not_stored_and_the_answer_says_so(
    tmp_path: Path,
) -> None:
    limit = "max_record_bytes = 8192\n"
    big_input = "y" * 10_000 + SAID
    # The input (some 6 KB, its script included) fits; the answer's 4 KB of text takes the
    # record past the limit.
    long_answer = "z" * 2_000 + script({"text": "w" * 4_000})
    async with running_sim(ROOMY_SIM) as sim:
        config = config_with_ledger(tmp_path, sim.base_url, f"[responses]\n{limit}")
        async with (
            running_gateway(config) as gateway,
            httpx.AsyncClient(timeout=TIMEOUT_S) as http,
        ):
            url = gateway.base_url + "/v1/responses"
            whole = await http.post(url, json={"model": "agent-lite", "input": big_input})
            assert whole.status_code == 200
            assert whole.headers[STORED_HEADER] == "false; reason=record_too_large"
            assert whole.json()["store"] is False
            streamed = await http.post(
                url, json={"model": "agent-lite", "input": big_input, "stream": True}
            )
            # Known before the first byte: said in the header too.
            assert streamed.headers[STORED_HEADER] == "false; reason=record_too_large"
            late = await http.post(
                url, json={"model": "agent-lite", "input": long_answer, "stream": True}
            )
            # Known only at the end: said in the last event's response.
            assert STORED_HEADER not in late.headers
            last = json.loads(late.text.strip().rsplit("data: ", 1)[1])
            assert last["type"] == "response.completed"
            assert last["response"]["store"] is False
            kept = await http.post(url, json={"model": "agent-lite", "input": SAID})
            assert STORED_HEADER not in kept.headers and kept.json()["store"] is True
            for made, status in (
                (whole.json()["id"], 404),
                (last["response"]["id"], 404),
                (kept.json()["id"], 200),
            ):
                assert (await http.get(f"{url}/{made}")).status_code == status


async def test_a_failed_response_is_not_stored(stack: Stack) -> None:
    failing = script({"text": "partial"}, {"status": 500, "in_stream": True})
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        url = stack.v1 + "/responses"
        answer = await http.post(
            url, json={"model": "agent-lite", "input": failing, "stream": True}
        )
        last = json.loads(answer.text.strip().rsplit("data: ", 1)[1])
        assert last["type"] == "response.failed"
        assert (await http.get(f"{url}/{last['response']['id']}")).status_code == 404
        # Completed and incomplete ones are.
        for body in (
            {"input": SAID},
            {"input": script({"text": "w " * 40}), "max_output_tokens": 16},
        ):
            made = await http.post(url, json={"model": "agent-lite", **body})
            assert made.json()["status"] in ("completed", "incomplete")
            assert (await http.get(f"{url}/{made.json()['id']}")).status_code == 200
