"""Fixtures for the real-vLLM tier (`make test-vllm`).

The tests here need a real vLLM server (CPU build, tiny random Qwen3): the session-scoped
`vllm_server` fixture starts one (see vllm_server.py) and stops it at the end of the session.
They only run when the marker expression names `vllm` (`pytest -m vllm`) or when
TRIO_GATEWAY_VLLM_URL points at a running server; a plain `pytest` skips them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.vllm.vllm_server import VllmServer, group_rss_mb, running_vllm

_summary: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markexpr = str(config.getoption("markexpr", default="") or "")
    if "vllm" in markexpr or os.environ.get("TRIO_GATEWAY_VLLM_URL"):
        return
    skip = pytest.mark.skip(reason="real-vLLM tier: run `make test-vllm` (pytest -m vllm)")
    for item in items:
        # The marker, not `item.keywords`: keywords hold the directory name `vllm` too, which
        # would skip the pure tests here (test_wire_shape.py) that need no server.
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """A running vLLM: base_url (with /v1), root_url, api_key, pid, served_model_name."""
    with running_vllm() as server:
        yield server
        if server.pid is not None:
            _summary.append(
                f"vLLM pid {server.pid}: ready in {server.startup_s:.1f} s, "
                f"RSS {group_rss_mb(server.pid):.0f} MiB at teardown, log {server.log_path}"
            )
        else:
            _summary.append(f"vLLM at {server.root_url} (external, not started here)")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _summary:
        terminalreporter.write_line(line)
