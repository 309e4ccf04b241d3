"""A daily budget shared by replicas through the real redis-server: one replica spends, the
other refuses with the renewal time; Redis keeps the day's spend under its own key (which
expires a week after the day), and `trio-gateway usage --reconcile` compares it with the
ledger the replicas write."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import coredis
import httpx
import trio

from tests.e2e.harness import chat, provider_toml, running_gateway, running_sim
from tests.e2e.test_cli import CLI
from tests.e2e.test_limits import PRICES, write_keys
from tests.redis_server import running_redis
from trio_gateway.config.load import load_config
from trio_gateway.core.budget_period import period_of
from trio_gateway.core.keys import hash_key, new_key

TIMEOUT_S = 30


def config_file(tmp_path: Path, redis_url: str, sim_url: str, keys_file: Path) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f'[server]\nlisten = "127.0.0.1:0"\n[auth]\nkeys_file = "{keys_file}"\n'
        f'[redis]\nurl = "{redis_url}"\ntimeout_s = 1.0\nkey_prefix = "t:"\n'
        '[usage]\nledger = "usage.sqlite3"\nflush_interval_s = 0.05\n'
        f"[aliases.agent-lite]\n{provider_toml('sim-a', sim_url, max_inflight=16, extra=PRICES)}"
    )
    return path


async def reconcile(folder: Path) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(TIMEOUT_S):
        return await trio.run_process(
            [*CLI, "usage", "--reconcile"], cwd=folder, capture_stdout=True, capture_stderr=True,
            check=False,
        )  # fmt: skip


async def test_a_daily_budget_holds_across_replicas_and_reconciles(tmp_path: Path) -> None:
    keys_file, key = write_keys(tmp_path, 'budget = 0.06\nbudget_period = "day"')
    headers = {"authorization": f"Bearer {key}"}
    url = "/v1/chat/completions"
    async with running_redis() as redis, running_sim() as sim:
        path = config_file(tmp_path, redis.url, sim.base_url, keys_file)
        config = load_config(path, environ={"SIM_KEY": "sim-key"})
        async with (
            running_gateway(config) as a,
            running_gateway(config) as b,
            httpx.AsyncClient(timeout=TIMEOUT_S) as client,
        ):
            answers: list[httpx.Response] = []
            while len(answers) < 20:
                answers.append(
                    await client.post(a.base_url + url, json=chat(max_tokens=10), headers=headers)
                )
                if answers[-1].status_code != 200:
                    break
            refused = await client.post(b.base_url + url, json=chat(max_tokens=10), headers=headers)
        # Both replicas have stopped: their ledger is written out.
        today = period_of("day", time.time())
        codes = [a.status_code for a in answers]
        assert codes[-1] == 402 and set(codes[:-1]) == {200} and len(codes) >= 3, codes
        assert refused.status_code == 402, refused.text
        message = refused.json()["error"]["message"]
        assert f"its budget (0.06 a day, UTC) renews at {today.renews_at()}, in " in message
        assert refused.headers["x-ratelimit-limit-budget"] == "0.06"
        # What one replica spent, the other sees.
        left = answers[-1].headers["x-ratelimit-remaining-budget"]
        assert refused.headers["x-ratelimit-remaining-budget"] == left
        assert float(left) < 0.06

        spent_key = f"t:spent:{{alice}}:{today.id}"
        async with coredis.Redis(host="127.0.0.1", port=redis.port) as raw:
            spent = int(await raw.get(spent_key) or 0)
            assert spent == 60_000_000 - round(float(left) * 1e9)
            # Kept a week past the day, for --reconcile; then Redis lets it go.
            assert today.end is not None
            expected_ms = (today.end + 7 * 86400 - time.time()) * 1000
            assert abs(await raw.pttl(spent_key) - expected_ms) < 60_000
            agreed = await reconcile(tmp_path)
            assert agreed.returncode == 0, agreed.stderr
            await raw.incrby(spent_key, 1_000)  # a settle the ledger never saw
            differs = await reconcile(tmp_path)
    assert differs.returncode == 1, differs.stderr
    rows = agreed.stdout.decode().splitlines()
    assert rows[0].startswith("redis: redis://127.0.0.1:")
    assert rows[1].split() == ["key", "period", "redis", "ledger", "difference"]
    assert rows[2].split() == [
        "alice",
        today.id,
        f"{spent / 1e9:.6f}",
        f"{spent / 1e9:.6f}",
        "0.000000",
    ]
    assert differs.stdout.decode().splitlines()[2].split()[-1] == "+0.000001"


async def test_the_keys_panel_says_when_redis_cannot_say_what_was_spent(tmp_path: Path) -> None:
    admin = new_key()
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(
        f'[keys.ops]\nsha256 = "{hash_key(admin)}"\nadmin = true\n'
        + "".join(
            f'[keys.k{i}]\nsha256 = "{hash_key(new_key())}"\nbudget = 1.0\n' for i in range(3)
        )
    )
    async with running_redis() as redis, running_sim() as sim:
        path = config_file(tmp_path, redis.url, sim.base_url, keys_file)
        config = load_config(path, environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=20) as client:
            url = gateway.base_url + "/status.json"
            headers = {"authorization": f"Bearer {admin}"}
            read = (await client.get(url, headers=headers)).json()["keys"]
            redis.kill()
            started = time.monotonic()
            down = await client.get(url, headers=headers)
            took = time.monotonic() - started
    assert read["spend_lives"] == "redis" and read["problem"] is None
    assert [b["spent"] for b in read["budgets"]] == [0.0, 0.0, 0.0]
    assert down.status_code == 200  # the page still shows the providers
    panel = down.json()["keys"]
    assert "redis" in panel["problem"]
    assert [b["spent"] for b in panel["budgets"]] == [None, None, None]
    assert config.redis is not None
    assert took < 2 * config.redis.timeout_s + 1  # one deadline, not one per key
