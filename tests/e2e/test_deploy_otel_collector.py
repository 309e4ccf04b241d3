"""deploy/otel-collector/, checked against the gateway and the base Deployment: the collector's
pipeline is whole (each component it names is defined, the memory limiter first), it receives
where a gateway with the documented [tracing] sends, and the sidecar patch, applied to
deploy/kubernetes/base's Deployment, validates against the Kubernetes schemas (strict)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tests.e2e.deploy_files import BASE, DEPLOY, resource
from tests.e2e.test_deploy_kubernetes import K8S_VERSIONS
from tests.unit.test_config import GOOD
from trio_gateway.config.load import parse_config

COLLECTOR = DEPLOY / "otel-collector"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def collector_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((COLLECTOR / "otel-collector.yaml").read_text())
    return config


def sidecar_patch() -> dict[str, Any]:
    patch: dict[str, Any] = yaml.safe_load((COLLECTOR / "sidecar.yaml").read_text())
    return patch


def patched_deployment() -> dict[str, Any]:
    """The base Deployment with the sidecar patch merged as a strategic merge patch merges
    these lists: by each item's name."""
    deployment = copy.deepcopy(resource(BASE, "Deployment", "trio-gateway"))
    pod = deployment["spec"]["template"]["spec"]
    patch = sidecar_patch()["spec"]["template"]["spec"]
    assert set(patch) <= {"initContainers", "containers", "volumes"}, set(patch)
    for key, items in patch.items():
        merged = {item["name"]: item for item in pod.get(key, [])}
        merged.update({item["name"]: item for item in items})
        pod[key] = list(merged.values())
    return deployment


def test_the_pipeline_names_only_what_it_defines() -> None:
    config = collector_config()
    (pipeline,) = config["service"]["pipelines"].values()
    for kind in ("receivers", "processors", "exporters"):
        for name in pipeline[kind]:
            assert name in config[kind], f"{kind}: {name} is not defined"
    for name in config["service"]["extensions"]:
        assert name in config["extensions"]
    # The memory limiter first, as the collector's docs ask; a batch before the export.
    assert pipeline["processors"][0] == "memory_limiter"
    assert "batch" in pipeline["processors"]
    assert config["exporters"]["otlp_grpc"]["endpoint"] == "${env:TRACES_BACKEND}"


def test_the_collector_receives_where_the_documented_gateway_sends() -> None:
    receiver = collector_config()["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    documented = (DOCS / "configuration.md").read_text()
    example = documented.split("## `[tracing]`")[1].split("```toml\n")[1].split("```")[0]
    config = parse_config(GOOD + example, environ={"VLLM_API_KEY": "k", "OTLP_AUTHORIZATION": "x"})
    assert config.tracing is not None
    url = urlsplit(config.tracing.otlp_endpoint)
    assert f"{url.hostname}:{url.port}" == receiver == "127.0.0.1:4318"
    assert url.path == "/v1/traces"  # the OTLP/HTTP receiver's traces path


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_patched_deployment_validates(version: str) -> None:
    kubernetes_validate.validate(patched_deployment(), version, strict=True)


def test_the_sidecar_runs_the_config_from_its_configmap() -> None:
    pod = patched_deployment()["spec"]["template"]["spec"]
    (sidecar,) = pod["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: stops after the gateway
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = sidecar["volumeMounts"]
    assert volumes[mount["name"]]["configMap"]["name"] == "otel-collector-config"
    (arg,) = sidecar["args"]
    assert arg == f"--config={mount['mountPath']}/otel-collector.yaml"
    env = {e["name"] for e in sidecar["env"]}
    assert {"TRACES_BACKEND", "POD_IP"} <= env
    health = collector_config()["extensions"]["health_check"]["endpoint"]
    assert health.endswith(f":{sidecar['startupProbe']['httpGet']['port']}")
    # A pinned image, never :latest; non-root, read-only.
    assert not sidecar["image"].endswith(":latest") and ":" in sidecar["image"]
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    # The gateway's own container is untouched.
    assert [c["name"] for c in pod["containers"]] == ["gateway"]
