"""deploy/prometheus/scrape.yml: Prometheus finds the gateway pods by deployment.yaml's
annotations and scrapes /metrics with the admin key secret.yaml's keys file names; a gateway
that requires keys answers that scrape, and no other."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.e2e.deploy_files import BASE, DEPLOY, resource, secret_data
from tests.e2e.harness import provider_toml, running_gateway, running_sim
from trio_gateway.config.load import parse_config
from trio_gateway.core.keys import hash_key, new_key, parse_keys

SCRAPE = DEPLOY / "prometheus" / "scrape.yml"


def jobs() -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}


def relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus's `keep` and `replace` (regexes anchored as RE2's are), enough for these
    rules; None when a target is dropped."""
    labels = dict(labels)
    for rule in rules:
        value = ";".join(labels.get(name, "") for name in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule["action"] == "keep":
            if match is None:
                return None
        elif rule["action"] == "replace" and match is not None:
            replacement = re.sub(r"\$(\d+)", r"\\\1", rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(replacement)
    return labels


def test_the_pod_job_finds_the_gateway_pods_by_their_annotations() -> None:
    template = resource(BASE, "Deployment", "trio-gateway")["spec"]["template"]["metadata"]
    meta = {"__address__": "10.1.2.3:8080", "__meta_kubernetes_pod_name": "trio-gateway-x"}
    for name, value in template["labels"].items():
        meta["__meta_kubernetes_pod_label_" + re.sub(r"[^a-z0-9]", "_", name)] = value
    for name, value in template["annotations"].items():
        meta["__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-z0-9]", "_", name)] = value
    job = jobs()["trio-gateway"]
    target = relabel(job["relabel_configs"], meta)
    assert target is not None
    assert target["__address__"] == "10.1.2.3:8080"
    assert target["__metrics_path__"] == "/metrics"
    assert target["pod"] == "trio-gateway-x"
    # A pod of another app is not scraped with the gateway's key.
    other = dict(meta, __meta_kubernetes_pod_label_app_kubernetes_io_name="vllm")
    assert relabel(job["relabel_configs"], other) is None


def test_every_job_sends_the_admin_key_and_the_keys_file_has_one() -> None:
    for name, job in jobs().items():
        assert job["authorization"]["type"] == "Bearer", name
        assert job["authorization"]["credentials_file"].startswith("/etc/prometheus/secrets/")
    keys = parse_keys(secret_data(BASE, "trio-gateway-api-keys")["keys.toml"])
    assert [k.name for k in keys if k.admin] == ["prometheus"]


async def test_a_gateway_with_keys_answers_the_scrape_with_the_admin_key(tmp_path: Path) -> None:
    # secret.yaml's keys file, with a real key in the place of the placeholder.
    key = new_key()
    text = secret_data(BASE, "trio-gateway-api-keys")["keys.toml"]
    text = text.replace("0" * 63 + "1", hash_key(key))
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(text)
    credentials = tmp_path / "key"  # the file Prometheus reads, as the Secret mounts it
    credentials.write_text(key + "\n")
    async with running_sim() as sim:
        config = parse_config(
            f'[server]\nlisten = "127.0.0.1:0"\n[auth]\nkeys_file = "{keys_file}"\n'
            '[usage]\nledger = "none"\n'
            f"[aliases.agent-lite]\n{provider_toml('sim-a', sim.base_url)}"
            f'[aliases.prompt-enhance]\nproviders = ["sim-a"]\n',
            source="test.toml",
            environ={"SIM_KEY": "sim-key"},
        )
        async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=20) as client:
            url = gateway.base_url + jobs()["trio-gateway-hosts"]["metrics_path"]
            bearer = {"authorization": f"Bearer {credentials.read_text().strip()}"}
            scraped = await client.get(url, headers=bearer)
            anonymous = await client.get(url)
    assert scraped.status_code == 200 and "gateway_provider_in_flight" in scraped.text
    assert anonymous.status_code == 401
