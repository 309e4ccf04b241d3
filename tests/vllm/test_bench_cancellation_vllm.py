"""Scenario C on real vLLM (bench/cancellation_vllm.py) at tiny size, against the session's
vLLM: the run happens in all three modes and shows what it exists to show. The gateway passes
every leave on (vLLM aborts each leaver, almost nothing is generated for nobody); the naive
proxy passes none on (vLLM generates the leavers' answers to the end). Not a performance test:
the session's server is neither pinned nor the benchmark's batch size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import cancellation_vllm

from tests.vllm.vllm_server import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_gateway_aborts_leavers_naive_does_not(vllm_server: VllmServer, tmp_path: Path) -> None:
    args = ["--smoke", "--no-plots", "--results-dir", str(tmp_path)]
    args += ["--vllm-url", vllm_server.root_url, "--vllm-api-key", vllm_server.api_key]
    # The session's server runs 4 sequences; and no --bench-cpus: pytest's own affinity stays.
    args += ["--max-num-seqs", "4", "--bench-cpus", ""]
    assert cancellation_vllm.main(args) == 0
    (path,) = tmp_path.glob("cancellation_vllm-*.json")
    result = json.loads(path.read_text())
    rows = {row["mode"]: row for row in result["rows"]}
    assert sorted(rows) == ["direct", "gateway", "naive"]
    for mode, row in rows.items():
        assert row["errors"] == [], mode
        assert row["stayers_complete"] == row["stayers"] > 0, mode
        assert row["leavers_left"] == row["leavers"] > 0, mode
        # Every token the clients counted, vLLM counted too (one character, one token).
        assert row["generated_tokens"] >= row["delivered_tokens"] > 0, mode
    gateway, naive = rows["gateway"], rows["naive"]
    assert gateway["aborts"] == gateway["leavers"]
    assert naive["aborts"] == 0
    # Through the naive proxy every leaver's answer is generated to its end.
    assert naive["wasted_tokens"] >= 0.9 * naive["leavers_unread_tokens"]
    assert gateway["wasted_tokens"] <= 0.1 * naive["wasted_tokens"]
    assert len(result["targets"]) == 5
