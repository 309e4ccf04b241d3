"""The status page in a real headless browser (Debian's chromium, which `make test` installs):
it renders, shows a provider turning unhealthy when its simulator stops, and in-flight rising
under load. Screenshots are kept in build/test-artifacts/."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

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
    wait_until,
)
from tests.e2e.test_cancellation import LONG
from tests.e2e.test_health import PROBES
from trio_gateway.capacity.health import State
from trio_gateway.sim import SimHandle, serve_sim

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR", REPO / "build" / "test-artifacts"))
# The flags a headless chromium needs on a machine with a closed network and no display.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # Lets the page's script fetch status.json and render before the DOM is read.
    "--virtual-time-budget=5000",
)


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("chromium is missing: `make test` installs it (Debian package chromium)")
    return found


async def browse(url: str, profile: Path, *, screenshot: Path | None = None) -> str:
    """The page's DOM after its script ran, as chromium renders it."""
    args = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        await trio.run_process(
            [*args, f"--screenshot={screenshot}", "--window-size=1000,700", url],
            capture_stdout=True,
            capture_stderr=True,
        )
        assert (await trio.Path(screenshot).stat()).st_size > 1000
    done = await trio.run_process(
        [*args, "--dump-dom", url], capture_stdout=True, capture_stderr=True
    )
    return str(done.stdout.decode())


def row(dom: str, alias_index: int, provider: str) -> dict[str, str]:
    """The cells of one provider's row, by their labels."""
    rows = re.findall(rf'<tr data-provider="{provider}">(.*?)</tr>', dom)
    assert rows, dom[:2000]
    cells = re.findall(r'<td data-label="([^"]+)"[^>]*>(.*?)</td>', rows[alias_index])
    return {label: re.sub(r"<[^>]+>", "", text) for label, text in cells}


async def test_the_status_page_in_a_real_browser(tmp_path: Path) -> None:
    port = await _free_port()
    async with trio.open_nursery() as nursery, running_sim() as steady:
        flaky_scope = trio.CancelScope()

        async def run_flaky(*, task_status: trio.TaskStatus[SimHandle]) -> None:
            with flaky_scope:
                await serve_sim(FAST_SIM, port=port, task_status=task_status)

        await nursery.start(run_flaky)
        providers = provider_toml(
            "flaky", f"http://127.0.0.1:{port}", weight=1, probe=True, extra=PROBES
        ) + provider_toml("steady", steady.base_url, weight=1000, probe=True, extra=PROBES)
        async with running_gateway(gateway_config(providers)) as gateway:
            router = gateway.router
            await wait_until(
                lambda: all(h.state is State.HEALTHY for h in router.health.values()), timeout_s=5
            )
            profile = tmp_path / "profile"
            dom = await browse(
                gateway.base_url + "/", profile, screenshot=ARTIFACTS / "status-idle.png"
            )
            assert "<h2>agent-lite</h2>" in dom
            assert '<span id="overall" class="ready">ready</span>' in dom
            assert row(dom, 0, "steady")["state"] == "healthy"
            assert row(dom, 0, "steady")["in flight"] == "0 / 8"

            # Load: three long streams hold three of steady's slots.
            async with httpx.AsyncClient(timeout=30) as client:
                streaming = trio.Semaphore(0)

                async def hold() -> None:
                    body = chat(LONG, stream=True)
                    url = gateway.base_url + "/v1/chat/completions"
                    async with client.stream("POST", url, json=body) as response:
                        streaming.release()
                        async for _ in response.aiter_bytes():
                            pass

                async with trio.open_nursery() as load:
                    for _ in range(3):
                        load.start_soon(hold)
                    for _ in range(3):
                        await streaming.acquire()
                    await wait_until(lambda: router.upstreams["steady"].statistics().in_flight == 3)
                    dom = await browse(
                        gateway.base_url + "/status",
                        profile,
                        screenshot=ARTIFACTS / "status-load.png",
                    )
                    assert row(dom, 0, "steady")["in flight"] == "3 / 8"
                    assert 'style="width: 37.5%;"' in dom  # the bar: 3 of 8 slots
                    load.cancel_scope.cancel()

            # The flaky simulator stops: the page shows it unhealthy.
            flaky_scope.cancel()
            await wait_until(lambda: router.health["flaky"].state is State.UNHEALTHY, timeout_s=5)
            dom = await browse(
                gateway.base_url + "/", profile, screenshot=ARTIFACTS / "status-unhealthy.png"
            )
            flaky = row(dom, 0, "flaky")
            assert flaky["state"] == "unhealthy"
            assert 'class="state state-unhealthy"' in dom
            assert row(dom, 0, "steady")["state"] == "healthy"
            # Requests and TTFT over the last minutes: the three streams, cut by their client.
            assert int(row(dom, 0, "steady")["requests"]) == 3
            assert row(dom, 0, "steady")["TTFT"].endswith(" ms")
        nursery.cancel_scope.cancel()


async def _free_port() -> int:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


async def test_status_json_and_the_page_without_a_browser() -> None:
    async with running_sim() as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url, max_inflight=4))
        async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=20) as client:
            assert (
                await client.post(gateway.base_url + "/v1/chat/completions", json=chat())
            ).status_code == 200
            page = await client.get(gateway.base_url + "/")
            assert page.status_code == 200
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert b'fetch("status.json"' in page.content
            assert (await client.get(gateway.base_url + "/status")).content == page.content
            doc = (await client.get(gateway.base_url + "/status.json")).json()
    assert doc["status"] == "ready"
    assert doc["aliases"] == {"agent-lite": ["sim-a"]}
    sim_a = doc["providers"]["sim-a"]
    assert (sim_a["in_flight"], sim_a["max_inflight"], sim_a["queued"]) == (0, 4, 0)
    assert (sim_a["requests"], sim_a["errors"], sim_a["spills"]) == (1, 0, 0)
    assert sim_a["ttft_avg_ms"] is not None and sim_a["ttft_avg_ms"] <= sim_a["ttft_max_ms"]
