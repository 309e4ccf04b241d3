"""deploy/kubernetes/, checked against the gateway itself: the manifests validate offline against
Kubernetes' JSON schemas (strict: an unknown or misspelt field fails), each kustomization lists
exactly the files of its directory, gateway.toml parses with the gateway's own parser, and the
numbers that must agree across files do (the grace period holds preStop + the drain, the ports
and paths match gateway.toml, the gates of every gateway pod together stay below vLLM's
--max-num-seqs)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.e2e.deploy_files import (
    BASE,
    CONTAINERFILE,
    DRAIN_MARGIN_S,
    K8S,
    VLLM,
    api_key_envs,
    container,
    documents,
    flag_value,
    gateway_toml,
    listen_port,
    manifests,
    parsed_gateway_config,
    resource,
    secret_data,
)

# The oldest Kubernetes the manifests claim (no preStop `sleep` action, for one) and the newest
# that kubernetes-validate ships schemas for.
K8S_VERSIONS = ("1.29", "1.37")
# vLLM loads and compiles for minutes: its startupProbe must allow this long.
VLLM_STARTUP_S = 600
# Flags the gateway relies on (docs/providers.md, upstream-facts): tool calls, reasoning,
# cached tokens, /load.
VLLM_FLAGS = (
    "--enable-server-load-tracking",
    "--enable-prompt-tokens-details",
    "--reasoning-parser",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "--served-model-name",
    "--max-num-seqs",
)


def test_there_are_manifests_to_check() -> None:
    # The checks below iterate over files: make sure there are files to iterate over.
    names = {p.relative_to(K8S).as_posix() for p in manifests()}
    assert {"base/deployment.yaml", "base/hpa.yaml", "vllm/statefulset.yaml"} <= names


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.relative_to(K8S).as_posix())
def test_manifest_validates_against_the_kubernetes_schemas(path: Path, version: str) -> None:
    docs = documents(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        # strict: additionalProperties false, so a misspelt or misplaced field fails too.
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{path.name}: {doc['kind']}/{doc['metadata']['name']}: {where}: {exc}")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_generated_configmap_validates(version: str) -> None:
    # What kustomize's configMapGenerator makes of gateway.toml (less the hash suffix).
    generator = yaml.safe_load((BASE / "kustomization.yaml").read_text())["configMapGenerator"]
    (entry,) = generator
    data = {name: (BASE / name).read_text() for name in entry["files"]}
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": entry["name"]},
        "data": data,
    }
    kubernetes_validate.validate(configmap, version, strict=True)


@pytest.mark.parametrize("directory", [BASE, VLLM], ids=lambda p: p.name)
def test_each_kustomization_lists_exactly_its_files(directory: Path) -> None:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    listed = list(kustomization["resources"])
    for generator in kustomization.get("configMapGenerator", []):
        listed.extend(generator["files"])
    assert len(listed) == len(set(listed)), f"listed twice: {listed}"
    for name in listed:
        assert (directory / name).is_file(), f"{directory.name}/kustomization.yaml: {name} missing"
    present = {p.name for p in directory.iterdir() if p.is_file()} - {"kustomization.yaml"}
    assert present == set(listed), f"not listed: {present - set(listed)}"


def test_gateway_toml_parses_with_the_gateways_own_parser(tmp_path: Path) -> None:
    config = parsed_gateway_config(tmp_path)
    assert set(config.aliases) == {"agent-lite", "prompt-enhance"}
    vllm = config.providers()["vllm-qwen3"]
    assert len(vllm.endpoints) == 2 and vllm.routing == "affinity"
    assert config.providers()["cloud-fallback"].weight == 0
    assert config.redis is not None and config.usage.sink == "redis_stream"


def test_the_grace_period_holds_the_prestop_sleep_and_the_drain(tmp_path: Path) -> None:
    config = parsed_gateway_config(tmp_path)
    deployment = resource(BASE, "Deployment", "trio-gateway")
    pod = deployment["spec"]["template"]["spec"]
    command = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0].endswith("sleep"), command
    pre_stop_s = float(command[1])
    assert pre_stop_s >= 1
    # Kubernetes counts the grace period from the start of preStop.
    needed = pre_stop_s + config.server.drain_timeout_s + DRAIN_MARGIN_S
    assert pod["terminationGracePeriodSeconds"] >= needed


def test_the_deployment_matches_the_config_it_mounts(tmp_path: Path) -> None:
    config = parsed_gateway_config(tmp_path)
    deployment = resource(BASE, "Deployment", "trio-gateway")
    pod = deployment["spec"]["template"]["spec"]
    gateway = container(deployment)
    # The command line is the real one: `trio-gateway serve --config PATH`.
    assert gateway["args"][0] == "serve"
    config_path = flag_value(gateway["args"], "--config")
    # The port.
    (port,) = gateway["ports"]
    assert port["containerPort"] == listen_port(config.server.listen)
    service = resource(BASE, "Service", "trio-gateway")
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    # Probes: startup and liveness on the process, readiness on the providers and the drain.
    assert gateway["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # The config file is the ConfigMap that kustomize generates from gateway.toml.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in gateway["volumeMounts"]}
    config_mount = mounts[config_path]
    assert config_mount["subPath"] == "gateway.toml"
    generator = yaml.safe_load((BASE / "kustomization.yaml").read_text())["configMapGenerator"]
    assert volumes[config_mount["name"]]["configMap"]["name"] == generator[0]["name"]
    # The keys file is in the mounted Secret, as a directory (no subPath: updates arrive).
    # As gateway.toml names it (parsed_gateway_config points it at a local copy).
    keys_file = Path(tomllib.loads(gateway_toml())["auth"]["keys_file"])
    keys_mount = mounts[str(keys_file.parent)]
    assert "subPath" not in keys_mount
    secret_name = volumes[keys_mount["name"]]["secret"]["secretName"]
    assert keys_file.name in secret_data(BASE, secret_name)
    # Every api_key_env comes from a Secret of secret.yaml that holds it.
    env = {e["name"]: e for e in gateway["env"]}
    for name in api_key_envs(gateway_toml()):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["key"] in secret_data(BASE, ref["name"]), name
    # Non-root, read-only root filesystem; the user the image runs as.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
    assert gateway["securityContext"]["allowPrivilegeEscalation"] is False
    assert f"USER {pod['securityContext']['runAsUser']}:" in CONTAINERFILE.read_text()
    # One process, one core at most.
    assert gateway["resources"]["limits"]["cpu"] in ("1", 1, "1000m")


def test_vllm_replicas_are_the_gateways_endpoints(tmp_path: Path) -> None:
    config = parsed_gateway_config(tmp_path)
    vllm = config.providers()["vllm-qwen3"]
    statefulset = resource(VLLM, "StatefulSet", "vllm")
    service = resource(VLLM, "Service", "vllm")
    engine = container(statefulset)
    args = engine["args"]
    for flag in VLLM_FLAGS:
        assert any(a == flag or a.startswith(flag + "=") for a in args), flag
    assert flag_value(args, "--served-model-name") == vllm.model
    # One endpoint per replica, by the pod's stable name behind the headless Service.
    assert service["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    port = int(flag_value(args, "--port"))
    assert engine["ports"][0]["containerPort"] == port
    name, governing = statefulset["metadata"]["name"], service["metadata"]["name"]
    assert list(vllm.endpoints) == [
        f"http://{name}-{i}.{governing}:{port}/v1" for i in range(statefulset["spec"]["replicas"])
    ]
    # The gateway pods' gates together stay below what the engine runs at once. With leases
    # in Redis, max_inflight is for all pods together, plus one probe per pod outside it;
    # without, each pod has its own and the autoscaler may run maxReplicas of them.
    hpa = resource(BASE, "HorizontalPodAutoscaler", "trio-gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "trio-gateway"
    max_num_seqs = int(flag_value(args, "--max-num-seqs"))
    pods = hpa["spec"]["maxReplicas"]
    if config.redis is not None and config.redis.leases:
        assert vllm.max_inflight + pods <= max_num_seqs
    else:
        assert pods * vllm.max_inflight < max_num_seqs
    # Start-up (minutes) has its own window, apart from liveness.
    startup = engine["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] >= VLLM_STARTUP_S
    assert engine["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "nvidia.com/gpu" in engine["resources"]["limits"]
    # The gateway calls a replica that never answered `starting` for at least as long.
    assert vllm.startup_grace_s >= VLLM_STARTUP_S
    # vLLM's key is the gateway's VLLM_API_KEY (placeholders both: the same name, at least).
    ref = next(e for e in engine["env"] if e["name"] == vllm.api_key_env)["valueFrom"]
    assert ref["secretKeyRef"]["key"] in secret_data(VLLM, ref["secretKeyRef"]["name"])
