"""Fixtures for the real-vLLM tier (`make test-vllm`).

The tests here need a real vLLM server (CPU build, tiny random Qwen3): the session-scoped
`vllm_server` fixture starts one (see vllm_server.py) and stops it at the end of the session.
They only run when the marker expression names `vllm` (`pytest -m vllm`) or when
TRIO_GATEWAY_VLLM_URL points at a running server; a plain `pytest` skips them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.vllm.helpers import vllm_gateway
from tests.vllm.vllm_server import VllmServer, group_rss_mb, running_vllm
from trio_gateway.process.serve import GatewayHandle

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


@pytest.fixture(scope="session")
def vllm_embedder() -> Iterator[VllmServer]:
    """A second vLLM serving the tiny model as an embedding model (`--runner pooling`),
    started only for the tests that take it."""
    with running_vllm(pooling=True) as server:
        yield server
        _summary.append(f"vLLM (pooling) pid {server.pid}: ready in {server.startup_s:.1f} s")


# The gateway in front of the session's vLLM, and raw httpx against it: the two files of
# test_gateway_vllm*.py take them.
@pytest.fixture
async def gateway(vllm_server: VllmServer) -> AsyncIterator[GatewayHandle]:
    async with vllm_gateway(vllm_server) as handle:
        yield handle


@pytest.fixture
async def gw(gateway: GatewayHandle) -> AsyncIterator[httpx.AsyncClient]:
    """Raw httpx against the gateway (root URL: /v1/..., /metrics, /readyz)."""
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=120.0) as client:
        yield client


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _summary:
        terminalreporter.write_line(line)
