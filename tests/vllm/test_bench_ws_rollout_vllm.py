"""Scenario H on real vLLM (``bench/ws_rollout.py --upstream vllm``) at smoke size, against
the session's vLLM: a rollout of two named tool calls and the answer, over HTTP and over the
Responses WebSocket, each fitted to vLLM's 2,048 tokens. Not a performance test: the
session's server is not pinned, and one rollout a mode says nothing about time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import ws_rollout

from tests.vllm.vllm_server import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_rollouts_over_http_and_the_socket(vllm_server: VllmServer, tmp_path: Path) -> None:
    args = ["--upstream", "vllm", "--smoke", "--no-plots", "--results-dir", str(tmp_path)]
    args += ["--vllm-url", vllm_server.root_url, "--vllm-api-key", vllm_server.api_key]
    args += ["--bench-cpus", ""]  # pytest's own affinity stays
    assert ws_rollout.main(args) == 0
    (path,) = tmp_path.glob("ws_rollout_vllm-*.json")
    result = json.loads(path.read_text())
    fitted = result["fitted"]
    assert fitted["tokens_needed"] <= vllm_server.max_model_len
    rows = {row["mode"]: row for row in result["rows"]}
    assert sorted(rows) == ["http", "ws"]
    for mode, row in rows.items():
        assert row["completed"] == row["rollouts"] == 1 and not row["errors"], (mode, row)
        assert row["turns"] == 3, mode  # two calls and the answer
        # vLLM saw the whole conversation both ways: the last prompt is the one /tokenize
        # measured (the words differ a little with the mode's tag), and the earlier turns'
        # blocks came from vLLM's prefix cache.
        assert abs(max(row["input_tokens"]) - fitted["answer_prompt_tokens"]) <= 16, mode
        assert sum(row["cached_tokens"]) > 0, mode
        assert row["vllm"]["vllm:prefix_cache_hits_total"] > 0, mode
    assert sum(rows["ws"]["sent_bytes"]) < sum(rows["http"]["sent_bytes"])
    assert len(result["targets"]) == 2
