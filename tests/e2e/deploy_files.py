"""deploy/'s files, and readers of them for the tests that check them: the Kubernetes manifests
and the objects in them, gateway.toml (parsed by the gateway's own parser, as a pod would), the
flags of a container's command line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import GatewayConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
BASE = K8S / "base"
VLLM = K8S / "vllm"
NGINX_CONF = DEPLOY / "nginx" / "trio-gateway.conf"
SYSTEMD_UNIT = DEPLOY / "systemd" / "trio-gateway.service"
CONTAINERFILE = DEPLOY / "Containerfile"
DASHBOARD = DEPLOY / "grafana" / "trio-gateway.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"

# docs/operations.md: the grace period after SIGTERM must exceed drain_timeout_s by this much
# (the drain's margin, 2 s; the log's flush at exit, at most 2 s; the exit).
DRAIN_MARGIN_S = 5


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def manifests() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def resource(directory: Path, kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (and ``name``) among a directory's manifests."""
    found = [
        doc
        for path in sorted(directory.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in documents(path)
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{directory}: {len(found)} {kind} {name or ''}"
    return found[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    spec: dict[str, Any] = containers[0]
    return spec


def gateway_toml() -> str:
    return (BASE / "gateway.toml").read_text(encoding="utf-8")


def api_key_envs(text: str) -> set[str]:
    return set(re.findall(r'^api_key_env\s*=\s*"([^"]+)"', text, flags=re.MULTILINE))


def secret_data(directory: Path, name: str) -> dict[str, str]:
    data: dict[str, str] = resource(directory, "Secret", name)["stringData"]
    return data


def parsed_gateway_config(tmp_path: Path) -> GatewayConfig:
    """gateway.toml parsed by the gateway's own parser, as a pod would: the variables it names
    set (to dummy values), and its keys file the one secret.yaml holds, written where the
    parser can read it (in the pod, the Secret's mount)."""
    text = gateway_toml()
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(secret_data(BASE, "trio-gateway-api-keys")["keys.toml"])
    text, count = re.subn(
        r'^keys_file = "[^"]*"$', f'keys_file = "{keys_file}"', text, flags=re.MULTILINE
    )
    assert count == 1
    environ = {name: f"dummy-{name.lower()}" for name in api_key_envs(text)}
    return parse_config(text, source="deploy/kubernetes/base/gateway.toml", environ=environ)


def listen_port(listen: str) -> int:
    return int(listen.rpartition(":")[2])


def flag_value(args: list[str], flag: str) -> str:
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.partition("=")[2]
    raise AssertionError(f"no {flag} in {args}")
