"""A budget holds across a restart without Redis, as an operator meets it: the console script
creates a key with a daily budget, serves the starter config with prices, the key spends its
budget, `trio-gateway stop`, `serve` again, and the key still gets 402; `keys list` and
`usage` show the spend throughout."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_cli import CLI, default_config_on_free_ports

# 1e-3 per token, in and out: a request of a short prompt and 5 tokens costs about 0.015.
PRICES = "price_input_per_mtok = 1000.0\nprice_output_per_mtok = 1000.0\nweight = 100\n"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def serve(folder: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "serve", "--config", "gateway.toml"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=folder,
    )


def wait_serving(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError("the gateway did not start")


def stop(folder: Path, proc: subprocess.Popen[str]) -> str:
    assert run("stop", "--config", "gateway.toml", cwd=folder).returncode == 0
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    return stderr


def ask(port: int, key: str) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={
            "model": "agent-lite",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
        },
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_a_spent_budget_still_refuses_after_stop_and_serve(tmp_path: Path, workers: int) -> None:
    """With workers, the budget is the supervisor's (its host broker's store, which every
    worker asks): that is the store a restart must rebuild."""
    config, port = default_config_on_free_ports(tmp_path)
    text = config.read_text().replace("open = true", 'keys_file = "keys.toml"')
    text = text.replace("[server]\n", f"[server]\nworkers = {workers}\n", 1)
    config.write_text(text.replace("weight = 100\n", PRICES))
    made = run(
        "keys", "new", "alice", "--aliases", "agent-lite", "--budget", "0.05",
        "--budget-period", "day", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    key = made.stdout.splitlines()[-1]

    first = serve(tmp_path)
    try:
        wait_serving(port, first)
        answers = [ask(port, key) for _ in range(6)]
    finally:
        first_log = stop(tmp_path, first) if first.poll() is None else ""
    codes = [a.status_code for a in answers]
    assert codes[0] == 200 and 402 in codes, codes
    spent_codes = codes[: codes.index(402)]
    assert set(spent_codes) == {200}
    assert "spend of 1 key with a budget rebuilt from the usage ledger" in first_log
    refusal = answers[codes.index(402)].json()["error"]["message"]
    renews = refusal.rpartition("renews at ")[2].split(",")[0]
    assert renews.endswith("T00:00:00Z")

    listed = run("keys", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("alice"))
    assert "budget: 0.05; period: day (renews " in line
    spent = float(line.split("spent: ")[1].split(";")[0])
    remaining = float(line.split("remaining: ")[1].rstrip(")"))
    assert spent > 0.03 and abs(spent + remaining - 0.05) < 1e-6

    second = serve(tmp_path)
    try:
        wait_serving(port, second)
        again = ask(port, key)
    finally:
        second_log = stop(tmp_path, second)
    assert again.status_code == 402, again.text
    assert f"renews at {renews}, in " in again.json()["error"]["message"]
    assert again.headers["x-ratelimit-limit-budget"] == "0.05"
    assert float(again.headers["x-ratelimit-remaining-budget"]) == round(remaining, 9)
    rebuilt = next(x for x in second_log.splitlines() if "rebuilt from the usage ledger" in x)
    assert "spend of 1 key with a budget" in rebuilt
    assert float(rebuilt.split(" s (")[1].split(" spent")[0]) == spent

    usage = run("usage", "--by", "key", cwd=tmp_path)
    assert usage.returncode == 0, usage.stderr
    alice = next(x for x in usage.stdout.splitlines() if x.startswith("alice"))
    assert float(alice.split()[-1]) == spent
