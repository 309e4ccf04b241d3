"""Three gateway processes, one real Redis, one simulator with 16 sequences behind
``max_inflight = 8``: the limit holds across the processes (leases, gate.py), and a process
killed with SIGKILL gives its slots back within ``lease_ttl_s``."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
from bench.processes import free_port

from tests.e2e.harness import FAST_SIM, chat, running_sim, script
from tests.e2e.test_cli import CLI
from tests.redis_server import RedisServer, running_redis
from trio_gateway.sim import SimHandle

LEASE_TTL_S = 1.5
# 16 sequences: the engine would run all 24 of a burst at once if the gateways let it.
SIM = attrs.evolve(FAST_SIM, max_num_seqs=16, decode_step_s=0.01, decode_step_s_per_seq=0.0)


def config_text(
    port: int, sim: SimHandle, redis: RedisServer, queue_timeout_s: float = 60.0, extra: str = ""
) -> str:
    return f"""
[server]
listen = "127.0.0.1:{port}"
drain_timeout_s = 2.0

[redis]
url = "{redis.url}"
lease_ttl_s = {LEASE_TTL_S}
# Twice the default 0.25 s (a third of lease_ttl_s, the most the checks allow): on a loaded
# 2-core machine a lease call missed 0.25 s and the gate shared max_inflight locally
# (on_lease_error). Redis's slowness has its own tests (test_gate_redis.py); the limit across
# processes is what is under test here.
timeout_s = {LEASE_TTL_S / 3}

[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "vllm"
type = "openai_compatible"
base_url = "{sim.base_url}/v1"
model = "qwen3-32b"
api_key_env = "SIM_KEY"
max_inflight = 8
queue_timeout_s = {queue_timeout_s}
probe = false
{extra}"""


@asynccontextmanager
async def gateways(
    tmp_path: Path, sim: SimHandle, redis: RedisServer, count: int = 3, **config: Any
) -> AsyncIterator[list[tuple[subprocess.Popen[bytes], str]]]:
    running = []
    try:
        for i in range(count):
            port = free_port()
            path = tmp_path / f"gateway-{i}.toml"
            path.write_text(config_text(port, sim, redis, **config))
            proc = subprocess.Popen(  # noqa: ASYNC220 - started here, waited on below
                [*CLI, "serve", "--config", str(path)],
                stdout=subprocess.DEVNULL,
                stderr=(tmp_path / f"gateway-{i}.log").open("w"),
                env={"SIM_KEY": "sim-key", "PATH": "/usr/bin:/bin"},
            )
            running.append((proc, f"http://127.0.0.1:{port}"))
        async with httpx.AsyncClient(timeout=1) as client:
            for proc, base in running:
                with trio.fail_after(30):
                    while True:
                        assert proc.poll() is None, (tmp_path / "gateway-0.log").read_text()
                        try:
                            if (await client.get(base + "/readyz")).status_code == 200:
                                break
                        except httpx.TransportError:
                            pass
                        await trio.sleep(0.05)
        yield running
    finally:
        for proc, _ in running:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


async def sim_stats(sim: SimHandle) -> dict[str, int]:
    async with httpx.AsyncClient() as client:
        stats: dict[str, int] = (await client.get(sim.base_url + "/sim/stats")).json()
    return stats


async def stream(base: str, tokens: int, started: trio.Event | None = None) -> str:
    body = chat(script({"text_tokens": tokens}), stream=True)
    async with (
        httpx.AsyncClient(timeout=120) as client,
        client.stream("POST", base + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        parts = []
        async for text in response.aiter_text():
            if started is not None and "content" in text:
                started.set()
            parts.append(text)
    return "".join(parts)


async def test_a_burst_on_three_gateways_never_runs_more_than_max_inflight(
    tmp_path: Path,
) -> None:
    async with (
        running_redis() as redis,
        running_sim(SIM) as sim,
        gateways(tmp_path, sim, redis) as running,
    ):
        answers: list[str] = []

        async def one(base: str) -> None:
            answers.append(await stream(base, tokens=80))

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                for _, base in running:
                    nursery.start_soon(one, base)
        assert len(answers) == 24
        assert all(a.rstrip().endswith("data: [DONE]") for a in answers)
        stats = await sim_stats(sim)
        # The limit held, and was reached: the test could have seen it broken.
        assert stats["max_running_seen"] == 8, stats
        assert stats["requests"] == 24
        values: dict[str, str] = {}

        async def leases_left() -> float:
            async with httpx.AsyncClient() as client:
                page = (await client.get(running[0][1] + "/metrics")).text
            for line in page.splitlines():
                if line.startswith("gateway_lease"):
                    name, value = line.rsplit(" ", 1)
                    values[name] = value
            return float(values['gateway_lease_cluster_in_flight{gate="vllm"}'])

        # All leases given back, as the gateway sees it within a renewal interval (ttl / 3).
        with trio.fail_after(LEASE_TTL_S + 2):
            while await leases_left() != 0:  # noqa: ASYNC110 - another process's gauge
                await trio.sleep(0.05)
        # Every process has seen the other two; at least an acquire and a release per request
        # of this gateway went to Redis.
        assert float(values["gateway_lease_peers"]) == 3
        assert float(values["gateway_lease_redis_calls_total"]) >= 2 * 8
        assert float(values["gateway_lease_redis_errors_total"]) == 0
        assert float(values["gateway_lease_fallback"]) == 0


async def test_a_killed_gateway_gives_its_slots_back_within_the_lease_ttl(
    tmp_path: Path,
) -> None:
    async with (
        running_redis() as redis,
        running_sim(SIM) as sim,
        gateways(tmp_path, sim, redis, count=2) as running,
    ):
        (doomed, doomed_base), (_, survivor_base) = running
        async with trio.open_nursery() as nursery:
            # The doomed gateway takes all 8 slots with long streams.
            for _ in range(8):
                started = trio.Event()

                async def hold(started: trio.Event = started) -> None:
                    # Cut by the kill.
                    with contextlib.suppress(httpx.HTTPError, AssertionError):
                        await stream(doomed_base, tokens=100_000, started=started)

                nursery.start_soon(hold)
                await started.wait()
            # The survivor's request waits: no slot anywhere.
            served = trio.Event()
            waited: list[float] = []

            async def wait_for_slot() -> None:
                await stream(survivor_base, tokens=5, started=served)
                served.set()

            nursery.start_soon(wait_for_slot)
            with trio.move_on_after(LEASE_TTL_S):
                await served.wait()
            assert not served.is_set(), "served while every slot was leased elsewhere"
            doomed.send_signal(signal.SIGKILL)
            killed_at = trio.current_time()
            with trio.fail_after(LEASE_TTL_S + 2.0):
                await served.wait()
            waited.append(trio.current_time() - killed_at)
        # The kill also closed the doomed gateway's upstream connections (the sim aborts),
        # but what frees the survivor is the lease expiry, within the TTL.
        assert waited[0] <= LEASE_TTL_S + 1.0, waited


async def fill(base: str, nursery: trio.Nursery, slots: int) -> None:
    """``slots`` long streams on the gateway at ``base``, each started when this returns."""
    for _ in range(slots):
        started = trio.Event()

        async def hold(started: trio.Event = started) -> None:
            with contextlib.suppress(httpx.HTTPError, AssertionError):
                await stream(base, tokens=100_000, started=started)

        nursery.start_soon(hold)
        await started.wait()


async def test_spill_keeps_its_meaning_across_gateways_and_redis_down_is_not_a_hang(
    tmp_path: Path,
) -> None:
    """Gateway A holds all 8 leases: gateway B's request waits its queue_timeout_s, then
    spills to the fallback. With Redis gone, B admits its share (on_lease_error = share) at
    once: no request hangs on Redis."""
    async with (
        running_redis() as redis,
        running_sim(SIM) as sim,
        running_sim(SIM) as fallback,
    ):
        extra = f"""
[[aliases.agent-lite.providers]]
name = "fallback"
type = "openai_compatible"
base_url = "{fallback.base_url}/v1"
model = "qwen3-32b"
api_key_env = "SIM_KEY"
weight = 0
probe = false
"""
        async with (
            gateways(tmp_path, sim, redis, count=2, queue_timeout_s=0.5, extra=extra) as running,
            trio.open_nursery() as nursery,
        ):
            (_, a), (_, b) = running
            await fill(a, nursery, 8)
            began = trio.current_time()
            answer = await stream(b, tokens=5)
            waited = trio.current_time() - began
            assert answer.rstrip().endswith("data: [DONE]")
            assert (await sim_stats(fallback))["requests"] == 1
            assert (await sim_stats(sim))["requests"] == 8
            assert 0.5 <= waited < 5.0, waited
            # Redis gone: B takes its share (8 // 2 gateways seen) without leases, at once.
            redis.kill()
            began = trio.current_time()
            answer = await stream(b, tokens=5)
            assert answer.rstrip().endswith("data: [DONE]")
            assert trio.current_time() - began < 3.0
            assert (await sim_stats(sim))["requests"] == 9
            nursery.cancel_scope.cancel()
