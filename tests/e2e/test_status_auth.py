"""The operator's endpoints behind a key: when the gateway requires keys, /status.json and
/metrics need a key marked `admin = true`; the page itself holds no data and asks for the key;
/healthz and /readyz stay open and say only ready or not and why, in one word. `[server] status
= "open"` keeps them open. The status page's keys panel: spend against budget, top keys today."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from tests.e2e.browser import Tab, browser_tab
from tests.e2e.harness import chat, provider_toml, running_gateway, running_sim
from tests.e2e.test_status_page import ARTIFACTS
from trio_gateway.capacity.health import ProviderHealth
from trio_gateway.config.load import parse_config
from trio_gateway.core.keys import hash_key, new_key
from trio_gateway.process.serve import GatewayHandle

PRICES = "price_input_per_mtok = 1000.0\nprice_output_per_mtok = 1000.0\n"
ADMIN, ALICE = new_key(), new_key()


def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text(
        f'[keys.ops]\nsha256 = "{hash_key(ADMIN)}"\nadmin = true\n'
        f'[keys.alice]\nsha256 = "{hash_key(ALICE)}"\nbudget = 1.0\nbudget_period = "day"\n'
    )
    return path


@asynccontextmanager
async def gateway(tmp_path: Path, sim_url: str, server: str = "") -> AsyncIterator[GatewayHandle]:
    text = (
        f'[server]\nlisten = "127.0.0.1:0"\n{server}\n'
        f'[auth]\nkeys_file = "{keys_file(tmp_path)}"\n[usage]\nledger = "none"\n'
        f"[aliases.agent-lite]\n{provider_toml('sim-a', sim_url, extra=PRICES)}"
    )
    config = parse_config(text, source="test.toml", environ={"SIM_KEY": "sim-key"})
    async with running_gateway(config) as handle:
        yield handle


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_status_data_and_metrics_need_an_admin_key(tmp_path: Path) -> None:
    async with (
        running_sim() as sim,
        gateway(tmp_path, sim.base_url) as gw,
        httpx.AsyncClient(base_url=gw.base_url, timeout=20) as client,
    ):
        spent = await client.post(
            "/v1/chat/completions", json=chat(max_tokens=10), headers=bearer(ALICE)
        )
        assert spent.status_code == 200, spent.text
        for path in ("/status.json", "/metrics"):
            missing = await client.get(path)
            assert missing.status_code == 401, path
            assert missing.json()["error"]["code"] == "invalid_api_key"
            assert missing.headers["www-authenticate"] == 'Bearer realm="trio-gateway"'
            not_admin = await client.get(path, headers=bearer(ALICE))
            assert not_admin.status_code == 403, path
            assert not_admin.json()["error"]["code"] == "admin_required"
            assert "admin = true" in not_admin.json()["error"]["message"]
        doc = (await client.get("/status.json", headers=bearer(ADMIN))).json()
        metrics = await client.get("/metrics", headers=bearer(ADMIN))
        # The page holds no data: it asks for the key and reads status.json with it.
        page = await client.get("/")
        ready = await client.get("/readyz")
        live = await client.get("/healthz")
        detailed = await client.get("/readyz", headers=bearer(ADMIN))
    assert metrics.status_code == 200 and "gateway_requests_total" in metrics.text
    assert page.status_code == 200 and b"sim-a" not in page.content
    assert b"sessionStorage" in page.content
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert live.status_code == 200 and live.json() == {"status": "ok"}
    assert "sim-a" in detailed.json()["providers"]
    assert doc["providers"]["sim-a"]["requests"] == 1
    cost = spent_cost(spent)
    assert doc["keys"]["spend_lives"] == "this process"
    (alice,) = doc["keys"]["budgets"]
    assert alice["name"] == "alice" and alice["budget"] == 1.0 and alice["period"] == "day"
    assert alice["spent"] == cost and alice["remaining"] == round(1.0 - cost, 9)
    assert alice["renews_at"].endswith("T00:00:00Z")
    assert doc["keys"]["top_today"] == [{"name": "alice", "cost": cost}]


def spent_cost(answer: httpx.Response) -> float:
    usage = answer.json()["usage"]
    tokens: int = usage["prompt_tokens"] + usage["completion_tokens"]
    return round(tokens * 1e-3, 9)


async def test_readyz_says_why_in_one_word_and_names_nothing(tmp_path: Path) -> None:
    gone = "http://127.0.0.1:9"  # nothing listens: the provider fails its probe
    async with gateway(tmp_path, gone) as gw, httpx.AsyncClient(timeout=20) as client:
        health = gw.router.health["sim-a"]
        assert isinstance(health, ProviderHealth)
        health.not_serving("sim-a does not serve the configured model")
        ready = await client.get(gw.base_url + "/readyz")
        gw.router.drain.begin()
        draining = await client.get(gw.base_url + "/readyz")
    assert ready.status_code == 503
    assert ready.json() == {"status": "not_ready", "reason": "no_provider"}
    assert draining.status_code == 503
    assert draining.json() == {"status": "draining", "reason": "draining"}


async def test_status_open_keeps_the_operator_endpoints_open(tmp_path: Path) -> None:
    async with (
        running_sim() as sim,
        gateway(tmp_path, sim.base_url, server='status = "open"') as gw,
        httpx.AsyncClient(base_url=gw.base_url, timeout=20) as client,
    ):
        doc = await client.get("/status.json")
        metrics = await client.get("/metrics")
        ready = await client.get("/readyz")
        live = await client.get("/healthz")
    assert doc.status_code == 200 and "sim-a" in doc.json()["providers"]
    assert metrics.status_code == 200
    assert "sim-a" in ready.json()["providers"]
    assert "pid" in live.json()


async def test_the_page_asks_for_the_key_and_keeps_it_for_the_tab(tmp_path: Path) -> None:
    """In the real headless chromium: the page asks for the key, shows the status and the keys
    panel once an admin key is typed, keeps it across a reload (sessionStorage), refuses a key
    that is not admin with the gateway's words, and forgets the key when asked."""
    async with (
        running_sim() as sim,
        gateway(tmp_path, sim.base_url) as gw,
        httpx.AsyncClient(base_url=gw.base_url, timeout=20) as client,
    ):
        spent = await client.post(
            "/v1/chat/completions", json=chat(max_tokens=10), headers=bearer(ALICE)
        )
        assert spent.status_code == 200
        async with browser_tab(gw.base_url + "/", tmp_path / "profile") as tab:
            await tab.wait_for("!document.getElementById('login').hidden")
            assert await tab.evaluate("document.querySelector('[data-provider]')") is None
            await type_key(tab, ALICE)
            why = await tab.wait_for(
                "document.getElementById('login-why').textContent.includes('may not read') && "
                "document.getElementById('login-why').textContent"
            )
            assert why.startswith("API key 'alice' may not read the gateway's status")
            await type_key(tab, ADMIN)
            await tab.wait_for("!!document.querySelector('tr[data-provider=\"sim-a\"]')")
            assert await tab.evaluate(f"sessionStorage.getItem('{KEY_STORE}')") == ADMIN
            row = await tab.wait_for(CELLS.format(selector='tr[data-key="alice"]'))
            assert row["period"] == "day" and row["budget"] == "1"
            assert float(row["spent"]) == spent_cost(spent)
            assert row["renews"].endswith("T00:00:00Z")
            top = await tab.evaluate(CELLS.format(selector='tr[data-top-key="alice"]'))
            assert float(top["cost"]) == spent_cost(spent)
            await tab.screenshot(ARTIFACTS / "status-keys.png")
            # A reload keeps the key: the page shows the status without asking again.
            await tab.send("Page.reload")
            await tab.wait_for("!!document.querySelector('tr[data-provider=\"sim-a\"]')")
            assert await tab.evaluate("document.getElementById('login').hidden") is True
            await tab.evaluate("document.getElementById('forget').click()")
            await tab.wait_for("!document.getElementById('login').hidden")
            assert await tab.evaluate(f"sessionStorage.getItem('{KEY_STORE}')") is None


KEY_STORE = "trio-gateway-admin-key"
# A table row's cells by their labels, as an object.
CELLS = (
    "(() => {{ const row = document.querySelector('{selector}'); if (!row) return null;"
    " return Object.fromEntries([...row.cells].map(c => [c.dataset.label, c.textContent])); }})()"
)


async def type_key(tab: Tab, key: str) -> None:
    await tab.evaluate(
        f"document.getElementById('key').value = {key!r};"
        "document.getElementById('login').requestSubmit()"
    )
