"""Readiness probes against real simulators: out of rotation when down, back after restart."""

from __future__ import annotations

import logging
from functools import partial

import httpx
import pytest
import trio

from tests.e2e.harness import (
    FAST_SIM,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from trio_gateway.capacity.health import State
from trio_gateway.sim import SimHandle, serve_sim

PROBES = (
    "probe_interval_s = 0.2\nprobe_timeout_s = 1.0\nunhealthy_after = 2\nhealthy_after = 1\n"
    "startup_grace_s = 0\nconnect_timeout_s = 0.5"
)


async def free_port() -> int:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


async def test_a_stopped_provider_leaves_rotation_and_comes_back_after_restart() -> None:
    port = await free_port()
    async with trio.open_nursery() as nursery, running_sim() as steady:
        flaky_scope = trio.CancelScope()

        async def run_flaky(*, task_status: trio.TaskStatus[SimHandle]) -> None:
            with flaky_scope:
                await serve_sim(FAST_SIM, port=port, task_status=task_status)

        await nursery.start(run_flaky)
        flaky_url = f"http://127.0.0.1:{port}"
        providers = provider_toml(
            "flaky", flaky_url, weight=1000, probe=True, extra=PROBES
        ) + provider_toml("steady", steady.base_url, weight=1, probe=True, extra=PROBES)
        async with running_gateway(gateway_config(providers)) as gateway:
            health = gateway.router.health["flaky"]
            # The probe marks the provider healthy, then reads its /load: wait for both.
            await wait_until(
                lambda: health.state is State.HEALTHY and health.upstream_load is not None
            )
            url = gateway.base_url + "/v1/chat/completions"
            async with httpx.AsyncClient() as client:
                ready = await client.get(gateway.base_url + "/readyz")
                assert ready.status_code == 200
                assert ready.json()["providers"]["flaky"]["state"] == "healthy"
                # The probe also read the simulator's /load (nothing running: 0).
                assert ready.json()["providers"]["flaky"]["upstream_load"] == 0
                page = (await client.get(gateway.base_url + "/metrics")).text
                assert 'gateway_provider_upstream_load{provider="flaky"} 0.0' in page

                flaky_scope.cancel()  # the flaky simulator goes away
                stopped_at = trio.current_time()
                await wait_until(lambda: health.state is State.UNHEALTHY, timeout_s=5)
                # probe_interval_s times unhealthy_after, plus one probe's own time.
                assert trio.current_time() - stopped_at < 0.2 * 2 + 1.0

                before = steady.engine.stats().requests
                for _ in range(5):
                    assert (await client.post(url, json=chat())).status_code == 200
                # Out of rotation: all traffic moved although flaky weighs 1000 times more.
                assert steady.engine.stats().requests - before >= 5
                ready = await client.get(gateway.base_url + "/readyz")
                assert ready.status_code == 200  # steady still serves the alias
                assert ready.json()["providers"]["flaky"]["state"] == "unhealthy"

                restarted = await nursery.start(partial(serve_sim, FAST_SIM, port=port))
                await wait_until(lambda: health.state is State.HEALTHY, timeout_s=5)
                assert (await client.post(url, json=chat())).status_code == 200
                assert restarted.engine.stats().requests >= 1  # probes and traffic again
            nursery.cancel_scope.cancel()


async def test_readyz_is_503_when_an_alias_has_no_live_provider() -> None:
    port = await free_port()
    providers = provider_toml("gone", f"http://127.0.0.1:{port}", probe=True, extra=PROBES)
    async with running_gateway(gateway_config(providers)) as gateway:
        await wait_until(lambda: gateway.router.health["gone"].state is State.UNHEALTHY)
        async with httpx.AsyncClient() as client:
            ready = await client.get(gateway.base_url + "/readyz")
            live = await client.get(gateway.base_url + "/healthz")
        assert ready.status_code == 503
        assert ready.json()["aliases_without_provider"] == ["agent-lite"]
        assert "cannot connect" in ready.json()["providers"]["gone"]["last_error"]
        assert live.status_code == 200


async def test_a_provider_refusing_connections_in_its_grace_is_unreachable_and_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A closed port (a typo'd base_url, or a vLLM still loading: they look the same) is in
    rotation for startup_grace_s, so /readyz stays 200; but it is shown `unreachable`, not
    plain ready, and each failed probe is a warning naming the provider, its URL and why."""
    port = await free_port()
    url = f"http://127.0.0.1:{port}"
    providers = provider_toml(
        "typo", url, probe=True, extra="startup_grace_s = 600\nprobe_interval_s = 0.1"
    )
    caplog.set_level(logging.INFO, logger="trio_gateway.health")
    async with running_gateway(gateway_config(providers)) as gateway:
        # The first probe ran before the gateway served; wait for two more.
        await wait_until(lambda: len(health_warnings(caplog)) >= 3)
        async with httpx.AsyncClient() as client:
            ready = await client.get(gateway.base_url + "/readyz")
            live = await client.get(gateway.base_url + "/healthz")
            status = (await client.get(gateway.base_url + "/status.json")).json()
            metrics = (await client.get(gateway.base_url + "/metrics")).text
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    typo = ready.json()["providers"]["typo"]
    assert typo["state"] == "unreachable"
    assert "cannot connect" in typo["last_error"] and "refused" in typo["last_error"]
    assert live.status_code == 200  # liveness is the process's, never a provider's
    assert status["providers"]["typo"]["state"] == "unreachable"
    assert "cannot connect" in status["providers"]["typo"]["last_error"]
    assert 'gateway_provider_state{provider="typo",state="unreachable"} 1.0' in metrics
    assert 'gateway_provider_state{provider="typo",state="starting"} 0.0' in metrics
    for message in health_warnings(caplog):
        assert message.startswith(f"provider typo: unreachable at {url}/v1, it has never answered")
        assert "cannot connect" in message and "refused" in message.lower()
        assert "s more of startup_grace_s" in message


def health_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "trio_gateway.health" and r.levelno == logging.WARNING
    ]


async def test_passive_failures_on_real_traffic_count_too() -> None:
    port = await free_port()
    async with running_sim() as steady:
        providers = provider_toml(
            "dead", f"http://127.0.0.1:{port}", weight=1000, extra=PROBES.replace("0.2", "60")
        ) + provider_toml("steady", steady.base_url, weight=1)
        async with running_gateway(gateway_config(providers)) as gateway:
            async with httpx.AsyncClient() as client:
                for _ in range(3):
                    response = await client.post(
                        gateway.base_url + "/v1/chat/completions", json=chat()
                    )
                    assert response.status_code == 200  # failed over to steady
            assert gateway.router.health["dead"].state is State.UNHEALTHY


async def test_a_saturated_provider_stays_healthy() -> None:
    """Probes bypass the gate, and refusals are not failures: busy is not broken."""
    async with running_sim() as sim:
        providers = provider_toml(
            "busy",
            sim.base_url,
            max_inflight=1,
            probe=True,
            extra=PROBES + "\nqueue_timeout_s = 0",
        )
        async with running_gateway(gateway_config(providers)) as gateway:
            health = gateway.router.health["busy"]
            # The probe marks the provider healthy, then reads its /load: wait for both.
            await wait_until(
                lambda: health.state is State.HEALTHY and health.upstream_load is not None
            )
            url = gateway.base_url + "/v1/chat/completions"
            async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
                nursery.start_soon(
                    partial(client.post, url, json=chat(script({"text_tokens": 1000})))
                )
                upstream = gateway.router.upstreams["busy"]
                await wait_until(lambda: upstream.statistics().in_flight == 1)
                for _ in range(5):
                    refused = await client.post(url, json=chat())
                    assert refused.json()["error"]["code"] == "overloaded"
                probes_before = sim.engine.stats().requests
                # Two probe intervals later, probes have answered although the slot is taken.
                await wait_until(lambda: sim.engine.stats().requests >= probes_before + 2)
                assert health.state is State.HEALTHY
                assert (await client.get(gateway.base_url + "/readyz")).status_code == 200
                nursery.cancel_scope.cancel()


async def test_a_wrong_model_name_is_unhealthy_at_once_not_ready_for_the_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server answers, in vLLM's words, that it serves another model: it is not loading.
    Before, the provider was `unreachable` and /readyz said 200 "ready" for all 600 s of
    startup_grace_s."""
    caplog.set_level(logging.INFO, logger="trio_gateway.health")
    async with running_sim() as sim:  # serves qwen3-32b only
        providers = provider_toml(
            "typo-model", sim.base_url, probe=True, extra="startup_grace_s = 600"
        ).replace('model = "qwen3-32b"', 'model = "qwen3-8b"')
        async with running_gateway(gateway_config(providers)) as gateway:
            # The first probe has run by the time the gateway serves.
            assert gateway.router.health["typo-model"].state is State.UNHEALTHY
            async with httpx.AsyncClient() as client:
                ready = await client.get(gateway.base_url + "/readyz")
                status = (await client.get(gateway.base_url + "/status.json")).json()
    assert ready.status_code == 503 and ready.json()["status"] == "not_ready"
    shown = status["providers"]["typo-model"]
    assert shown["state"] == "unhealthy"
    assert "The model `qwen3-8b` does not exist. Valid aliases: qwen3-32b." in shown["last_error"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(
        m.startswith("provider typo-model: the readiness probe's request names a model or route")
        and "The model `qwen3-8b` does not exist." in m
        for m in errors
    )
