"""Config reload on a running gateway (reloader.py): new requests see the new aliases, weights,
providers and limits; streams in flight finish where they started; a bad file changes nothing.

Two real simulators, blue and green, stand for two vLLM deployments of one served model."""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from tests.e2e.harness import (
    FAST_SIM,
    chat,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from tests.redis_server import running_redis
from trio_gateway.config.load import load_config
from trio_gateway.core import keys as key_file
from trio_gateway.dispatch.live import Running
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.providers.upstream import Upstream
from trio_gateway.sim import SimHandle

ENV = {"SIM_KEY": "sim-key"}


def write_config(path: Path, providers: str, server: str = "") -> None:
    path.write_text(
        f'[server]\nlisten = "127.0.0.1:0"\n{server}\n[aliases.agent-lite]\n{providers}'
    )


def loader(path: Path) -> Any:
    return partial(load_config, path, environ=ENV)


async def requests_seen(sim: SimHandle) -> int:
    async with httpx.AsyncClient() as client:
        stats = (await client.get(sim.base_url + "/sim/stats")).json()
    return int(stats["requests"])


async def ask(gateway: GatewayHandle, n: int) -> list[int]:
    statuses = []
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(n):
            response = await client.post(
                gateway.base_url + "/v1/chat/completions", json=chat(max_tokens=2)
            )
            statuses.append(response.status_code)
    return statuses


async def reload_counts(gateway: GatewayHandle) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        text = (await client.get(gateway.base_url + "/metrics")).text
    out = {}
    for line in text.splitlines():
        if line.startswith("gateway_config_reloads_total{"):
            result = line.split('result="')[1].split('"')[0]
            out[result] = float(line.rsplit(" ", 1)[1])
    return out


async def test_blue_green_weight_shift_moves_new_traffic_step_by_step(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    async with running_sim() as blue, running_sim() as green:
        write_config(path, provider_toml("blue", blue.base_url))
        async with running_gateway(load_config(path, environ=ENV), load=loader(path)) as gateway:
            assert await ask(gateway, 5) == [200] * 5
            assert (await requests_seen(blue), await requests_seen(green)) == (5, 0)
            # Step 1: green joins at weight 0 (a fallback only): nothing moves yet.
            write_config(
                path,
                provider_toml("blue", blue.base_url)
                + provider_toml("green", green.base_url, weight=0),
            )
            assert await gateway.reload()
            assert await ask(gateway, 5) == [200] * 5
            assert (await requests_seen(blue), await requests_seen(green)) == (10, 0)
            # Step 2: half and half.
            write_config(
                path,
                provider_toml("blue", blue.base_url, weight=50)
                + provider_toml("green", green.base_url, weight=50),
            )
            assert await gateway.reload()
            assert await ask(gateway, 40) == [200] * 40
            to_blue, to_green = await requests_seen(blue) - 10, await requests_seen(green)
            assert to_blue + to_green == 40
            assert 8 <= to_green <= 32, (to_blue, to_green)
            # Step 3: all on green; blue stays configured at weight 0, as a fallback.
            write_config(
                path,
                provider_toml("blue", blue.base_url, weight=0)
                + provider_toml("green", green.base_url, weight=100),
            )
            assert await gateway.reload()
            before_blue, before_green = await requests_seen(blue), await requests_seen(green)
            assert await ask(gateway, 10) == [200] * 10
            assert await requests_seen(blue) == before_blue
            assert await requests_seen(green) == before_green + 10
            assert await reload_counts(gateway) == {"applied": 3.0, "rejected": 0.0}
            # Weight changes keep the running providers: same gate, same health.
            assert gateway.router.upstreams["blue"] is gateway.reloader.running["blue"].provider


async def test_a_reload_under_load_loses_no_stream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Blue is replaced by green while 12 streams run on blue: every stream ends whole on blue,
    every new request goes to green, and blue's connections close after its last stream."""
    caplog.set_level(logging.INFO, logger="trio_gateway")
    path = tmp_path / "gateway.toml"
    tokens = 1000  # ~3 s per stream at the fast simulator's pace, 12 at once
    roomy = attrs.evolve(FAST_SIM, max_num_seqs=16)
    async with running_sim(roomy) as blue, running_sim(roomy) as green:
        write_config(path, provider_toml("blue", blue.base_url, max_inflight=16))
        async with running_gateway(load_config(path, environ=ENV), load=loader(path)) as gateway:
            old = gateway.reloader.running["blue"]
            answers: list[str] = []
            started = trio.Semaphore(0)

            async def stream() -> None:
                body = chat(
                    script({"text_tokens": tokens}),
                    stream=True,
                    stream_options={"include_usage": True},
                )
                async with (
                    httpx.AsyncClient(timeout=30) as client,
                    client.stream(
                        "POST", gateway.base_url + "/v1/chat/completions", json=body
                    ) as response,
                ):
                    assert response.status_code == 200
                    started.release()
                    answers.append("".join([line + "\n" async for line in response.aiter_lines()]))

            async with trio.open_nursery() as nursery:
                for _ in range(12):
                    nursery.start_soon(stream)
                for _ in range(12):
                    await started.acquire()
                await wait_until(lambda: old.provider.statistics().in_flight == 12)
                write_config(path, provider_toml("green", green.base_url, max_inflight=16))
                assert await gateway.reload()
                # New traffic: green only, while blue's streams still run.
                assert not old.idle()
                assert await ask(gateway, 4) == [200] * 4
                assert await requests_seen(green) == 4
            assert len(answers) == 12
            for body in answers:
                assert body.rstrip().endswith("data: [DONE]")
                assert '"error"' not in body
                usage = json.loads(body.split("data: ")[-2])["usage"]
                assert usage["completion_tokens"] >= tokens
            assert await requests_seen(blue) == 12
            assert "blue" not in gateway.router.upstreams
            await wait_until(lambda: "provider blue retired" in caplog.text, timeout_s=10)
            assert old.services is None or old.services.cancel_called


async def test_a_smaller_gate_keeps_the_requests_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    async with running_sim() as blue:
        extra = "queue_timeout_s = 0.2"
        write_config(path, provider_toml("blue", blue.base_url, max_inflight=4, extra=extra))
        async with running_gateway(load_config(path, environ=ENV), load=loader(path)) as gateway:
            running: Running = gateway.reloader.running["blue"]
            release = trio.Event()
            started = trio.Semaphore(0)

            async def hold() -> None:
                body = chat(script({"text_tokens": 100_000}), stream=True)
                async with (
                    httpx.AsyncClient(timeout=30) as client,
                    client.stream(
                        "POST", gateway.base_url + "/v1/chat/completions", json=body
                    ) as response,
                ):
                    started.release()
                    await release.wait()
                    del response

            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(hold)
                for _ in range(3):
                    await started.acquire()
                write_config(
                    path, provider_toml("blue", blue.base_url, max_inflight=2, extra=extra)
                )
                assert await gateway.reload()
                stats = running.provider.statistics()
                assert (stats.in_flight, stats.max_inflight) == (3, 2)
                assert gateway.router.upstreams["blue"] is running.provider
                # 3 held of 2: a new request finds no slot and is refused after its wait.
                assert await ask(gateway, 1) == [503]
                release.set()
            await wait_until(lambda: running.provider.statistics().in_flight == 0)
            assert await ask(gateway, 2) == [200, 200]


async def test_a_bad_file_changes_nothing_and_says_where(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gateway.toml"
    async with running_sim() as blue, running_sim() as green:
        write_config(path, provider_toml("blue", blue.base_url))
        async with running_gateway(load_config(path, environ=ENV), load=loader(path)) as gateway:
            before = gateway.reloader.config
            # Two problems in one file (an unknown key, a wrong type): both reported.
            write_config(
                path,
                provider_toml(
                    "green", green.base_url, extra='colour = "green"\nprobe_interval_s = "often"'
                ),
            )
            assert not await gateway.reload()
            # A change only a restart can apply.
            write_config(
                path, provider_toml("green", green.base_url), server="stream_buffer_events = 8"
            )
            assert not await gateway.reload()
            path.write_text("[server\n")
            assert not await gateway.reload()
            assert gateway.reloader.config is before
            assert list(gateway.router.upstreams) == ["blue"]
            assert await ask(gateway, 3) == [200] * 3
            assert await requests_seen(green) == 0
            assert await reload_counts(gateway) == {"applied": 0.0, "rejected": 3.0}
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            text = "\n".join(errors)
            assert "colour" in text and "probe_interval_s" in text
            assert "server.stream_buffer_events: changed (64 -> 8); a restart applies it" in text
            assert str(path) in text
            assert text.count("nothing changed") == 3


async def test_probes_start_and_stop_with_their_providers(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    probe = "probe_interval_s = 0.1"
    async with running_sim() as blue, running_sim() as green:
        write_config(path, provider_toml("blue", blue.base_url, probe=True, extra=probe))
        async with running_gateway(load_config(path, environ=ENV), load=loader(path)) as gateway:
            old = gateway.reloader.running["blue"]
            assert await requests_seen(blue) >= 1  # the first probe runs at start
            write_config(path, provider_toml("green", green.base_url, probe=True, extra=probe))
            assert await gateway.reload()
            assert old.services is not None and old.services.cancel_called
            # Green's first probe has run by the time the reload returns.
            assert await requests_seen(green) >= 1
            health = gateway.router.health["green"]
            await wait_until(lambda: health.state.value == "healthy")
            probed = await requests_seen(blue)
            # Blue's probe has stopped: two of its intervals pass without a probe.
            await trio.sleep(0.3)
            assert await requests_seen(blue) == probed


async def test_a_reload_reads_the_keys_file_it_names(tmp_path: Path) -> None:
    """The new file names another keys file: its keys work at once, the old file's do not."""
    old_key, new_key = key_file.new_key(), key_file.new_key()
    (tmp_path / "old.toml").write_text(f'[keys.a]\nsha256 = "{key_file.hash_key(old_key)}"\n')
    (tmp_path / "new.toml").write_text(f'[keys.b]\nsha256 = "{key_file.hash_key(new_key)}"\n')
    path = tmp_path / "gateway.toml"
    async with running_sim() as blue:

        def write(keys: str) -> None:
            server = f'[auth]\nkeys_file = "{tmp_path / keys}"\n'
            path.write_text(
                f'[server]\nlisten = "127.0.0.1:0"\n{server}[aliases.agent-lite]\n'
                + provider_toml("blue", blue.base_url)
            )

        async def status(key: str) -> int:
            async with httpx.AsyncClient(timeout=10) as client:
                response = await client.get(
                    gateway.base_url + "/v1/models", headers={"authorization": f"Bearer {key}"}
                )
            return response.status_code

        write("old.toml")
        async with running_gateway(load_config(path, environ=ENV), load=loader(path)) as gateway:
            assert (await status(old_key), await status(new_key)) == (200, 401)
            write("new.toml")
            assert await gateway.reload()
            assert (await status(old_key), await status(new_key)) == (401, 200)
            # A keys file with a problem: the whole reload is refused.
            (tmp_path / "broken.toml").write_text("[keys.c]\n")
            write("broken.toml")
            assert not await gateway.reload()
            assert (await status(old_key), await status(new_key)) == (401, 200)


async def test_a_replaced_leased_provider_retires_while_its_successor_is_busy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With leases, a replaced provider's gate is its successor's (one key, one set of slots):
    the old one must still retire once its own streams end, while the new one has traffic."""
    caplog.set_level(logging.INFO, logger="trio_gateway")
    path = tmp_path / "gateway.toml"
    async with running_redis() as redis, running_sim() as blue, running_sim() as green:
        server = f'[redis]\nurl = "{redis.url}"\n'

        def write(sim: SimHandle) -> None:
            path.write_text(
                f'[server]\nlisten = "127.0.0.1:0"\n{server}[aliases.agent-lite]\n'
                + provider_toml("vllm", sim.base_url)
            )

        write(blue)
        async with running_gateway(load_config(path, environ=ENV), load=loader(path)) as gateway:
            old = gateway.reloader.running["vllm"]
            release = trio.Event()

            async def hold(tokens: int) -> None:
                body = chat(script({"text_tokens": tokens}), stream=True)
                async with (
                    httpx.AsyncClient(timeout=30) as client,
                    client.stream(
                        "POST", gateway.base_url + "/v1/chat/completions", json=body
                    ) as response,
                ):
                    await release.wait()
                    await response.aread()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(hold, 50)
                await wait_until(lambda: old.provider.statistics().in_flight == 1)
                write(green)
                assert await gateway.reload()
                new, before = gateway.reloader.running["vllm"].provider, old.provider
                assert isinstance(new, Upstream) and isinstance(before, Upstream)
                assert new.gate is before.gate  # one key in Redis
                nursery.start_soon(hold, 100_000)  # the successor stays busy
                await wait_until(lambda: new.active == 1)
                release.set()
                await wait_until(lambda: "provider vllm retired" in caplog.text, timeout_s=10)
                assert new.active == 1
                nursery.cancel_scope.cancel()
