"""vLLM 0.32's `priority` field, on the real server: what the simulator's `--scheduling-policy`
imitates (sim/sched.py). Under the default fcfs policy the field is accepted and ignored (older
vLLMs refused it); under `--scheduling-policy priority` a waiting request of a lower number
runs first."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from tests.vllm.helpers import wait_metric
from tests.vllm.vllm_server import VllmServer, running_vllm

pytestmark = pytest.mark.vllm


def body(server: VllmServer, max_tokens: int, **more: Any) -> dict[str, Any]:
    return {
        "model": server.served_model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "chat_template_kwargs": {"enable_thinking": False},
        **more,
    }


@pytest.fixture(scope="module")
def priority_vllm() -> Iterator[VllmServer]:
    """One sequence at a time, waiting ones by priority."""
    with running_vllm(max_num_seqs=1, extra_args=["--scheduling-policy", "priority"]) as server:
        yield server


async def test_fcfs_accepts_a_priority_and_ignores_it(vllm_server: VllmServer) -> None:
    async with httpx.AsyncClient(
        base_url=vllm_server.base_url, headers=vllm_server.auth_headers, timeout=120
    ) as client:
        for priority in (-3, 7):
            response = await client.post(
                "/chat/completions", json=body(vllm_server, 2, priority=priority)
            )
            assert response.status_code == 200, response.text


async def test_the_priority_policy_runs_the_lower_number_first(priority_vllm: VllmServer) -> None:
    server = priority_vllm
    finished: list[str] = []
    async with (
        httpx.AsyncClient(base_url=server.base_url, headers=server.auth_headers, timeout=120) as c,
        httpx.AsyncClient(base_url=server.root_url, timeout=30) as root,
    ):

        async def ask(name: str, max_tokens: int, priority: int) -> None:
            response = await c.post(
                "/chat/completions", json=body(server, max_tokens, priority=priority)
            )
            assert response.status_code == 200, response.text
            finished.append(name)

        async with trio.open_nursery() as nursery:
            # The one slot is held ~3 s (20 ms per step), even by a request of priority 9:
            # vLLM does not preempt for a waiting one while the KV cache has room.
            nursery.start_soon(ask, "running", 150, 9)
            await wait_metric(root, "vllm:num_requests_running", 1, within=30)
            nursery.start_soon(ask, "low", 3, 5)
            await wait_metric(root, "vllm:num_requests_waiting", 1, within=10)
            nursery.start_soon(ask, "high", 3, 0)
            await wait_metric(root, "vllm:num_requests_waiting", 2, within=10)
    assert finished == ["running", "high", "low"]
