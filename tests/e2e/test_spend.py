"""Spend in plain sight: what each request cost, in the ledger and in `trio-gateway usage`, the
same amount its key's budget was billed."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.e2e.harness import (
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)
from tests.e2e.test_usage_ledger import cli, ledger_rows

# 1e-3 per prompt token, 2e-3 per completion token: 1,000,000 and 2,000,000 nanos.
PRICES = "price_input_per_mtok = 1000.0\nprice_output_per_mtok = 2000.0\n"


async def test_each_record_says_what_it_cost_and_usage_sums_it(tmp_path: Path) -> None:
    ledger = tmp_path / "usage.sqlite3"
    usage = f'[usage]\nledger = "{ledger}"\nflush_interval_s = 0.05\n'
    async with running_sim() as sim:
        providers = provider_toml("priced", sim.base_url, extra=PRICES)
        async with (
            running_gateway(gateway_config(providers, server=usage)) as gateway,
            httpx.AsyncClient(timeout=20) as client,
        ):
            for tokens in (8, 3):
                answer = await client.post(
                    gateway.base_url + "/v1/chat/completions",
                    json=chat(script({"text_tokens": tokens})),
                )
                assert answer.status_code == 200, answer.text
            refused = await client.post(
                gateway.base_url + "/v1/chat/completions", json=chat(model="nope")
            )
            assert refused.status_code == 404
    rows = ledger_rows(ledger)
    assert [r["outcome"] for r in rows] == ["completed", "completed", "refused"]
    for row in rows[:2]:
        assert row["prompt_tokens"] > 0 and row["completion_tokens"] >= 3
        expected = row["prompt_tokens"] * 1_000_000 + row["completion_tokens"] * 2_000_000
        assert row["cost_nanos"] == expected
    assert rows[2]["cost_nanos"] == 0  # refused: nothing answered, nothing cost
    total = sum(r["cost_nanos"] for r in rows)
    table = await cli(["usage", "--ledger", str(ledger), "--by", "provider"])
    lines = table.splitlines()
    assert lines[0].split()[-1] == "cost"
    assert lines[-2].split()[0] == "priced" and lines[-2].split()[-1] == f"{total / 1e9:.6f}"
    assert lines[-1].split()[0] == "total" and lines[-1].split()[-1] == f"{total / 1e9:.6f}"
