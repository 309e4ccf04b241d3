"""A provider with several replicas (``endpoints``): capacity is their sum, routing policies
choose among them, a replica that fails leaves rotation and comes back, a failed attempt moves
to another replica before another provider, and each replica shows on ``/metrics``.

Real simulators on free ports, a real gateway, real httpx.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import httpx
import pytest
import trio

from tests.e2e.harness import (
    FAST_SIM,
    chat,
    gateway_config,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from trio_gateway.capacity.replica_policy import Affinity, ReplicaView, session_key
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.providers.openai_compatible.replicas import ReplicaSet
from trio_gateway.sim import SimHandle, serve_sim


def replicas_toml(
    *urls: str, routing: str = "round_robin", max_inflight: int = 4, extra: str = ""
) -> str:
    endpoints = ", ".join(f'"{u}/v1"' for u in urls)
    return f"""
[[aliases.agent-lite.providers]]
name = "fleet"
type = "openai_compatible"
endpoints = [{endpoints}]
routing = "{routing}"
model = "qwen3-32b"
api_key_env = "SIM_KEY"
max_inflight = {max_inflight}
queue_timeout_s = 5
capabilities = ["tools", "reasoning", "json_schema"]
probe = false
{extra}
"""


def finished(sim: SimHandle) -> int:
    return sim.engine.stats().finished


def answered(sim: SimHandle) -> int:
    return sim.engine.stats().finished_by_reason.get("stop", 0)


def metric(gateway: GatewayHandle, name: str, **labels: str) -> float | None:
    return gateway.router.metrics.registry.get_sample_value(name, labels)


def fleet_of(gateway: GatewayHandle) -> ReplicaSet:
    fleet = gateway.router.upstreams["fleet"]
    assert isinstance(fleet, ReplicaSet)
    return fleet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def two_sims() -> AsyncIterator[tuple[SimHandle, SimHandle]]:
    async with running_sim() as a, running_sim() as b:
        yield a, b


def sessions_split(fleet: ReplicaSet, per_replica: int) -> list[str]:
    """Session ids whose ring owner, with every replica healthy, is each replica ``per_replica``
    times. Ports are random, so ten ids taken blindly all land on one replica about 1 run in 300.
    """
    # The fleet's own policy, so its ring and bound are the ones requests meet.
    policy = fleet.policy
    assert isinstance(policy, Affinity)
    views = [ReplicaView(r.name, 0, 1) for r in fleet.replicas]
    owned: dict[str, list[str]] = {r.name: [] for r in fleet.replicas}
    for i in range(10_000):
        owner = policy.order(views, session_key(f"s{i}", {}))[0]
        if len(owned[owner]) < per_replica:
            owned[owner].append(f"s{i}")
        if all(len(ids) == per_replica for ids in owned.values()):
            return [sid for ids in owned.values() for sid in ids]
    raise AssertionError(f"no {per_replica} sessions for each replica: {owned}")


async def ask(
    client: httpx.AsyncClient, gateway: GatewayHandle, text: str = "hi", **headers: str
) -> httpx.Response:
    return await client.post(
        gateway.base_url + "/v1/chat/completions",
        json=chat(script({"text": text})),
        headers=headers,
        timeout=30,
    )


async def test_round_robin_spreads_and_capacity_is_the_sum() -> None:
    slow = attrs.evolve(FAST_SIM, decode_step_s=0.05)
    async with running_sim(slow) as a, running_sim(slow) as b:
        config = gateway_config(replicas_toml(a.base_url, b.base_url, max_inflight=2))
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            fleet = fleet_of(gateway)
            assert fleet.statistics().max_inflight == 4
            # 4 at once fill both replicas' gates exactly; nobody waits.
            peak_waiting = 0

            async def watch() -> None:
                nonlocal peak_waiting
                while True:
                    peak_waiting = max(peak_waiting, fleet.statistics().waiting)
                    await trio.sleep(0.005)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                async with trio.open_nursery() as asks:
                    for _ in range(4):
                        asks.start_soon(ask, client, gateway, "x y z w")
                nursery.cancel_scope.cancel()
            assert (finished(a), finished(b)) == (2, 2)
            assert peak_waiting == 0
            for _ in range(6):
                assert (await ask(client, gateway)).status_code == 200
            assert (finished(a), finished(b)) == (5, 5)


async def test_affinity_keeps_a_session_on_one_replica() -> None:
    async with two_sims() as (a, b):
        config = gateway_config(replicas_toml(a.base_url, b.base_url, routing="affinity"))
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            # Six sessions the ring gives each replica: blind ids can all land on one.
            sessions = sessions_split(fleet_of(gateway), per_replica=6)
            homes: dict[str, int] = {}
            for turn in range(3):
                for session in sessions:
                    before = (finished(a), finished(b))
                    response = await ask(client, gateway, **{"x-session-id": session})
                    assert response.status_code == 200
                    home = 0 if finished(a) > before[0] else 1
                    assert homes.setdefault(session, home) == home, (session, turn)
            # Each replica got the six sessions the ring gives it (a's first), on every turn.
            assert [homes[s] for s in sessions] == [0] * 6 + [1] * 6


async def test_a_failed_replica_passes_the_attempt_to_another_replica() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with running_sim() as alive:
        config = gateway_config(replicas_toml(dead, alive.base_url, routing="round_robin"))
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            for _ in range(4):
                response = await ask(client, gateway)
                assert response.status_code == 200, response.text
            assert finished(alive) == 4
            # Within the provider: no failover between providers was counted.
            assert (
                metric(
                    gateway,
                    "gateway_failovers_total",
                    alias="agent-lite",
                    from_provider="fleet",
                    to_provider="fleet",
                )
                is None
            )
            fleet = fleet_of(gateway)
            dead_replica = fleet.replicas[0]
            assert dead_replica.health.last_error is not None


async def test_a_replica_failing_its_probes_leaves_rotation_and_comes_back() -> None:
    port = free_port()
    async with running_sim() as steady:
        config = gateway_config(
            replicas_toml(
                f"http://127.0.0.1:{port}",
                steady.base_url,
                routing="affinity",
                extra="probe = true\nprobe_interval_s = 0.05\nunhealthy_after = 1\n"
                "healthy_after = 1\nstartup_grace_s = 0\nprobe_timeout_s = 1\n"
                "scrape_interval_s = 0.05",
            ).replace("probe = false\n", "")
        )
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            fleet = fleet_of(gateway)
            flaky, _ = fleet.replicas
            await wait_until(lambda: flaky.health.state.value == "unhealthy")
            await wait_until(lambda: gateway.router.health["fleet"].state.value == "healthy")
            sessions = sessions_split(fleet, per_replica=5)
            # The probes generate too, one token ("length"); the scripted answers end "stop".
            before = answered(steady)
            for session in sessions:
                assert (await ask(client, gateway, **{"x-session-id": session})).status_code == 200
            # Every session went to the replica in rotation.
            assert answered(steady) - before == len(sessions)
            ready = (await client.get(gateway.base_url + "/readyz")).json()
            assert ready["status"] == "ready"
            shown = ready["providers"]["fleet"]
            assert shown["state"] == "healthy"
            assert shown["replicas"][f"127.0.0.1:{port}"]["state"] == "unhealthy"
            assert "cannot connect" in shown["replicas"][f"127.0.0.1:{port}"]["last_error"]
            body = (await client.get(gateway.base_url + "/metrics")).text
            label = f'provider="fleet",replica="127.0.0.1:{port}",state="unhealthy"'
            assert f"gateway_replica_state{{{label}}} 1.0" in body
            # The replica comes back on the same address: its sessions return to it.
            async with trio.open_nursery() as nursery:
                back: SimHandle = await nursery.start(
                    lambda task_status: serve_sim(FAST_SIM, port=port, task_status=task_status)
                )
                await wait_until(lambda: flaky.health.state.value == "healthy", timeout_s=10)
                for session in sessions:
                    response = await ask(client, gateway, **{"x-session-id": session})
                    assert response.status_code == 200
                # Exactly the sessions the ring gives the returning replica went back to it.
                assert answered(back) == len(sessions) // 2
                nursery.cancel_scope.cancel()


async def test_each_replica_shows_its_prefix_cache_hit_rate_on_metrics() -> None:
    async with two_sims() as (a, b):
        config = gateway_config(
            replicas_toml(
                a.base_url,
                b.base_url,
                routing="affinity",
                extra="probe = true\nprobe_interval_s = 30\nscrape_interval_s = 0.05",
            ).replace("probe = false\n", "")
        )
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            long_prompt = " ".join(f"word{i}" for i in range(400))
            fleet = fleet_of(gateway)
            # Wait for a first scrape of each replica: the baseline the hit rate counts from.
            await wait_until(
                lambda: all(
                    r.upstream.signals.prefix_cache_queries is not None for r in fleet.replicas
                )
            )
            for _ in range(3):
                response = await client.post(
                    gateway.base_url + "/v1/chat/completions",
                    json=chat(long_prompt + script({"text": "ok"})),
                    headers={"x-session-id": "one"},
                )
                assert response.status_code == 200
            await wait_until(
                lambda: any((r.upstream.prefix_cache.ratio or 0) > 0 for r in fleet.replicas)
            )
            body = (await client.get(gateway.base_url + "/metrics")).text
            ratios = [
                float(line.rsplit(" ", 1)[1])
                for line in body.splitlines()
                if line.startswith('gateway_prefix_cache_hit_ratio{provider="fleet"')
            ]
            assert ratios and max(ratios) > 0.3
            assert "gateway_replica_in_flight{" in body
            assert "gateway_upstream_kv_cache_usage{" in body


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('base_url = "http://x/v1"', "give base_url or endpoints, not both"),
        ("", "unknown routing policy 'sticky'"),
        ('type = "anthropic"', "endpoints: only for type 'openai_compatible'"),
    ],
)
def test_replica_config_errors(extra: str, message: str) -> None:
    from trio_gateway.config.schema import ConfigError

    routing = "round_robin" if extra else "sticky"
    text = replicas_toml("http://a:8000", "http://b:8000", routing=routing) + extra + "\n"
    text = text.replace('type = "openai_compatible"\n', "") if "type" in extra else text
    with pytest.raises(ConfigError) as caught:
        gateway_config(text)
    assert any(message in p for p in caught.value.problems), caught.value.problems


async def test_cached_prompt_tokens_reach_the_client() -> None:
    """vLLM with --enable-prompt-tokens-details reports the prompt tokens its prefix cache
    served; the gateway passes the count on in usage, streamed and not."""
    detailed = attrs.evolve(FAST_SIM, enable_prompt_tokens_details=True)
    async with running_sim(detailed) as sim:
        config = gateway_config(replicas_toml(sim.base_url, routing="affinity"))
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            prompt = " ".join(f"word{i}" for i in range(300)) + script({"text": "ok"})
            cached = []
            for stream in (False, True, False):
                body = chat(prompt, stream=stream)
                if stream:
                    body["stream_options"] = {"include_usage": True}
                response = await client.post(gateway.base_url + "/v1/chat/completions", json=body)
                assert response.status_code == 200
                if stream:
                    chunks = [
                        json.loads(line[6:])
                        for line in response.text.splitlines()
                        if line.startswith("data: {")
                    ]
                    usage = chunks[-1]["usage"]
                else:
                    usage = response.json()["usage"]
                cached.append(usage["prompt_tokens_details"]["cached_tokens"])
                assert usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]
            # The first saw an empty cache; the later ones found the whole prefix but the tail.
            assert cached[0] == 0
            assert cached[1] > 0 and cached[2] > 0
            assert cached[1] == cached[2] >= 256  # 300 words: at least 16 full blocks of 16
