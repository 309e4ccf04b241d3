"""``trio-gateway usage`` as an operator runs it: a real process reading a ledger the gateway
wrote, through the config that names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trio_gateway.accounting.ledger import connect, write_batch
from trio_gateway.core.usage import UsageRecord

CLI = [sys.executable, "-m", "trio_gateway"]

# A config whose cloud provider reads its key from a variable the operator's shell lacks.
CLOUD_CONFIG = """
[server]
listen = "127.0.0.1:8080"
[auth]
open = true
[usage]
ledger = "usage.sqlite3"
[aliases.agent-max]
[[aliases.agent-max.providers]]
name = "openai"
type = "openai"
model = "gpt-5"
api_key_env = "OPENAI_API_KEY_NOT_IN_THIS_SHELL"
price_input_per_mtok = 1.25
price_output_per_mtok = 10.0
"""


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_API_KEY")}
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env
    )


def test_usage_reads_the_ledger_of_a_config_without_its_providers_secrets(
    tmp_path: Path,
) -> None:
    (tmp_path / "gateway.toml").write_text(CLOUD_CONFIG)
    conn = connect(str(tmp_path / "usage.sqlite3"))
    write_batch(
        conn,
        [
            UsageRecord(
                request_id="r1",
                key="alice",
                alias="agent-max",
                provider="openai",
                outcome="completed",
                prompt_tokens=1000,
                completion_tokens=100,
                started_at=1.0,
            )
        ],
    )
    conn.close()
    result = run(["usage", "--config", "gateway.toml", "--by", "key"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "alice" in result.stdout
