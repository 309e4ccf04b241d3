"""deploy/: what ships for running the gateway, checked against the gateway itself.

- The Kubernetes manifests validate offline against Kubernetes' JSON schemas (strict: an unknown
  or misspelt field fails), and each kustomization lists exactly the files of its directory.
- The numbers that must agree across files do: the grace period holds preStop + the drain, the
  ports and paths match gateway.toml, the gates of every gateway pod together stay below vLLM's
  --max-num-seqs; gateway.toml parses with the gateway's own parser.
- nginx (Debian's, installed by the Makefile) runs deploy/nginx/trio-gateway.conf in front of a
  real gateway: SSE arrives unbuffered and byte for byte, the WebSocket works, request ids,
  trace context and session ids pass.
- The Grafana dashboard and the alert rules are valid PromQL and name only metrics that a
  running gateway exports.
- The systemd unit and the Containerfile fit what the gateway does (SIGHUP reloads, sd_notify;
  its port, user and config path).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
import tomllib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import kubernetes_validate
import promql_parser
import pytest
import trio
import trio_websocket
import yaml

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
from trio_gateway.capacity.replica_policy import Affinity, ReplicaView, session_key
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import GatewayConfig, ServerConfig
from trio_gateway.core.events_codec import TERMINAL_TYPES
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.sim import SimConfig, SimHandle

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

# The oldest Kubernetes the manifests claim (no preStop `sleep` action, for one) and the newest
# that kubernetes-validate ships schemas for.
K8S_VERSIONS = ("1.29", "1.37")
# docs/operations.md: the grace period after SIGTERM must exceed drain_timeout_s by this much
# (the drain's margin, 2 s; the log's flush at exit, at most 2 s; the exit).
DRAIN_MARGIN_S = 5
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
NGINX = Path("/usr/sbin/nginx")
# Metrics the dashboard reads from elsewhere (the kubelet's cAdvisor), not from the gateway.
FOREIGN_METRICS = frozenset({"container_cpu_usage_seconds_total"})
GATEWAY_METRIC = re.compile(r"(?<![A-Za-z0-9_])gateway_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
TIMEOUT_S = 20


# --- reading the files -------------------------------------------------------------------------


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


# --- Kubernetes --------------------------------------------------------------------------------


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


# --- systemd and the image ----------------------------------------------------------------------


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in SYSTEMD_UNIT.read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_the_systemd_unit_fits_what_the_gateway_handles(tmp_path: Path) -> None:
    settings = unit_settings()
    cli = (ROOT / "src" / "trio_gateway" / "cli.py").read_text()
    sources = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))
    # SIGHUP's default action ends the process without a drain: a reload may send it only
    # because the gateway handles it, through `trio-gateway reload`, which checks the file
    # first, for the unit's main process.
    assert "signal.SIGHUP" in cli
    (reload,) = settings["ExecReload"]
    assert reload.split()[1:] == [
        "reload",
        "--config",
        "/etc/trio-gateway/gateway.toml",
        "--pid",
        "$MAINPID",
    ]
    # Type=notify would wait forever for a READY=1 a gateway that does not notify never sends.
    if "NOTIFY_SOCKET" not in sources:
        assert settings["Type"] != ["notify"]
    else:
        assert settings["Type"] == ["notify"] and settings["NotifyAccess"] == ["main"]
    assert settings["KillSignal"] == ["SIGTERM"]
    (exec_start,) = settings["ExecStart"]
    assert exec_start.split()[1:3] == ["serve", "--config"]
    # Long enough for the drain of the Kubernetes example's config (60 s), with the margin.
    config = parsed_gateway_config(tmp_path)
    stop_s = int(settings["TimeoutStopSec"][0].removesuffix("s"))
    assert stop_s >= config.server.drain_timeout_s + DRAIN_MARGIN_S
    assert int(settings["LimitNOFILE"][0]) >= 16384
    assert settings["NoNewPrivileges"] == ["yes"]
    assert settings["ProtectSystem"] == ["strict"]


def test_the_containerfile_runs_the_gateway_as_deployed(tmp_path: Path) -> None:
    text = CONTAINERFILE.read_text()
    config = parsed_gateway_config(tmp_path)
    assert "FROM python:3.11-slim" in text
    assert 'ENTRYPOINT ["trio-gateway"]' in text
    assert f"EXPOSE {listen_port(config.server.listen)}" in text
    user = re.search(r"^USER (\d+):(\d+)$", text, flags=re.MULTILINE)
    assert user is not None and int(user.group(1)) != 0
    cmd_line = re.search(r"^CMD (\[.*\])$", text, flags=re.MULTILINE)
    assert cmd_line is not None
    cmd = json.loads(cmd_line.group(1))
    deployment = resource(BASE, "Deployment", "trio-gateway")
    assert cmd[:3] == container(deployment)["args"][:3]
    # What it copies is what `pip install .` needs.
    for copied in ("pyproject.toml", "README.md", "src"):
        assert (ROOT / copied).exists()


# --- nginx ---------------------------------------------------------------------------------------

# The two lines of trio-gateway.conf a site edits, and the test rewrites.
UPSTREAM_SERVER = re.compile(r"(upstream trio_gateway \{\s*server )127\.0\.0\.1:8080;")
LISTEN = re.compile(r"^(\s*)listen 80;$", flags=re.MULTILINE)


def site_conf(upstream: str, port: int) -> str:
    text = NGINX_CONF.read_text()
    text, upstreams = UPSTREAM_SERVER.subn(rf"\g<1>{upstream};", text)
    text, listens = LISTEN.subn(rf"\g<1>listen 127.0.0.1:{port};", text)
    assert (upstreams, listens) == (1, 1), "trio-gateway.conf's upstream or listen line changed"
    return text


def main_conf(prefix: Path, site: Path) -> str:
    """A whole nginx.conf around the site file, every path in ``prefix`` (runs as any user)."""
    return f"""
daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {site};
}}
"""


@contextmanager
def nginx_prefix() -> Iterator[Path]:
    """A directory for nginx's config, logs and temp files. Not pytest's tmp_path: when the
    tests run as root, nginx's workers run as `nobody` and must be able to reach it."""
    prefix = Path(tempfile.mkdtemp(prefix="trio-gateway-nginx-"))
    prefix.chmod(0o755)
    try:
        yield prefix
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def nginx_test(conf: Path, prefix: Path) -> None:
    assert NGINX.exists(), f"{NGINX} missing: `make test` installs Debian's nginx"
    result = subprocess.run(
        [str(NGINX), "-t", "-p", str(prefix), "-c", str(conf)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nginx_accepts_the_shipped_file_as_it_is() -> None:
    with nginx_prefix() as prefix:
        conf = prefix / "nginx.conf"
        conf.write_text(main_conf(prefix, NGINX_CONF))
        nginx_test(conf, prefix)


def test_nginx_body_limit_is_the_gateways() -> None:
    found = re.findall(r"^\s*client_max_body_size (\d+)([km]?);", NGINX_CONF.read_text(), re.M)
    assert len(found) == 1
    number, unit = found[0]
    scale = {"": 1, "k": 1024, "m": 1024 * 1024}[unit]
    assert int(number) * scale == ServerConfig().max_body_bytes


def nginx_logs(prefix: Path) -> str:
    logs = (prefix / name for name in ("stderr.log", "error.log"))
    return "\n".join(log.read_text(errors="replace") for log in logs if log.exists())


@asynccontextmanager
async def running_nginx(upstream: str) -> AsyncIterator[str]:
    """nginx with deploy/nginx/trio-gateway.conf in front of ``upstream``; yields its URL."""
    with nginx_prefix() as prefix:
        port = free_port()
        site = prefix / "trio-gateway.conf"
        site.write_text(site_conf(upstream, port))
        conf = prefix / "nginx.conf"
        conf.write_text(main_conf(prefix, site))
        nginx_test(conf, prefix)
        with (prefix / "stderr.log").open("wb") as stderr:
            process = await trio.lowlevel.open_process(
                [str(NGINX), "-p", str(prefix), "-c", str(conf)], stderr=stderr
            )
        try:
            with trio.fail_after(10):
                while True:
                    assert process.poll() is None, nginx_logs(prefix)
                    try:
                        stream = await trio.open_tcp_stream("127.0.0.1", port)
                    except OSError:
                        await trio.sleep(0.02)
                        continue
                    await stream.aclose()
                    break
            yield f"http://127.0.0.1:{port}"
        finally:
            # Our own nginx only, by its pid: SIGTERM is its fast shutdown.
            process.terminate()
            with trio.move_on_after(5):
                await process.wait()
            if process.poll() is None:
                process.kill()
                await process.wait()


# A slow engine: a stream lasts long enough (~1.3 s) to tell its first chunk from its end.
SLOW_SIM = attrs.evolve(FAST_SIM, decode_step_s=0.03)
STREAM_WORDS = 40


def replicas_toml(*sims: SimHandle, probe: bool) -> str:
    endpoints = ", ".join(f'"{s.base_url}/v1"' for s in sims)
    probing = (
        "probe = true\nprobe_interval_s = 0.05\nscrape_interval_s = 0.05\nstartup_grace_s = 0"
        if probe
        else "probe = false"
    )
    return f"""
[[aliases.agent-lite.providers]]
name = "fleet"
type = "openai_compatible"
endpoints = [{endpoints}]
routing = "affinity"
model = "qwen3-32b"
api_key_env = "SIM_KEY"
max_inflight = 4
queue_timeout_s = 5
capabilities = ["tools", "reasoning", "json_schema"]
{probing}
"""


@asynccontextmanager
async def fleet(
    sim: SimConfig, *, probe: bool
) -> AsyncIterator[tuple[GatewayHandle, SimHandle, SimHandle]]:
    async with running_sim(sim) as a, running_sim(sim) as b:
        config = gateway_config(replicas_toml(a, b, probe=probe))
        async with running_gateway(config) as gateway:
            yield gateway, a, b


def normalised(body: str) -> str:
    """A stream with what differs between two runs of the same answer blanked: the
    response id and its timestamp."""
    body = re.sub(r'"id":\s*"[^"]*"', '"id": "-"', body)
    return re.sub(r'"created":\s*\d+', '"created": 0', body)


async def timed_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[float, float, str]:
    """(seconds to the first `data:` line, seconds to the end, the body)."""
    started = time.monotonic()
    first: float | None = None
    received = bytearray()
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for chunk in response.aiter_bytes():
            if first is None and b"data: {" in received + chunk:
                first = time.monotonic() - started
            received += chunk
    assert first is not None
    return first, time.monotonic() - started, received.decode()


def replica_of(key: str, a: SimHandle, b: SimHandle) -> SimHandle:
    """The replica `affinity` sends ``key`` to when both are idle (the policy is pure)."""
    names = {s.base_url.removeprefix("http://"): s for s in (a, b)}
    views = [ReplicaView(name=n, in_flight=0, capacity=4) for n in names]
    return names[Affinity().order(views, key)[0]]


async def test_nginx_in_front_of_a_gateway_streams_sse_websocket_and_ids() -> None:
    words = " ".join(f"w{i}" for i in range(STREAM_WORDS))
    body = chat(script({"text": words}), stream=True)
    with trio.fail_after(TIMEOUT_S):
        async with fleet(SLOW_SIM, probe=False) as (gateway, a, b):
            upstream = gateway.base_url.removeprefix("http://")
            async with running_nginx(upstream) as proxy, httpx.AsyncClient(timeout=10) as client:
                # (a) SSE through nginx arrives as it is generated, not when it is complete.
                first_s, total_s, via_nginx = await timed_stream(
                    client, proxy + "/v1/chat/completions", body
                )
                assert total_s > 0.5, "the stream was too fast to tell buffering apart"
                assert first_s < 0.25 * total_s, (first_s, total_s)
                # ... and byte for byte what the gateway sends directly.
                _, _, direct = await timed_stream(
                    client, gateway.base_url + "/v1/chat/completions", body
                )
                assert normalised(via_nginx) == normalised(direct)
                assert via_nginx.rstrip().endswith("data: [DONE]")

                # (c) The client's X-Request-Id comes back, and reaches vLLM with the trace.
                trace = "4bf92f3577b34da6a3ce929d0e0e4736"
                response = await client.post(
                    proxy + "/v1/chat/completions",
                    json=chat(script({"text": "ok"})),
                    headers={
                        "X-Request-Id": "deploy-test-42",
                        "traceparent": f"00-{trace}-00f067aa0ba902b7-01",
                    },
                )
                assert response.status_code == 200, response.text
                assert response.headers["x-request-id"] == "deploy-test-42"
                sent = [
                    h
                    for sim in (a, b)
                    for h in sim.engine.stats().last_request_headers
                    if h.get("x-request-id") == "deploy-test-42"
                ]
                assert len(sent) == 1
                assert sent[0]["traceparent"].split("-")[1] == trace
                # Without one, nginx's own $request_id (32 hex digits) is the gateway's id.
                response = await client.post(
                    proxy + "/v1/chat/completions", json=chat(script({"text": "ok"}))
                )
                assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])

                # X-Session-Id reaches the affinity policy: requests whose own opening would
                # go to one replica follow their session to the other.
                session = "deploy-session-1"
                target = replica_of(session_key(session, {}), a, b)
                bodies = [
                    candidate
                    for candidate in (
                        chat(f"question {i}" + script({"text": "ok"})) for i in range(40)
                    )
                    if replica_of(session_key(None, candidate), a, b) is not target
                ][:3]
                assert len(bodies) == 3
                before = target.engine.stats().finished
                for session_body in bodies:
                    response = await client.post(
                        proxy + "/v1/chat/completions",
                        json=session_body,
                        headers={"X-Session-Id": session},
                    )
                    assert response.status_code == 200
                assert target.engine.stats().finished - before == 3

                # (b) The WebSocket through nginx: a request, its streamed events, its end.
                events: list[dict[str, Any]] = []
                ws_url = proxy.replace("http://", "ws://") + "/v1/ws"
                async with trio_websocket.open_websocket_url(ws_url) as ws:
                    await ws.send_message(
                        json.dumps(
                            {"type": "request", "id": "r1", "body": chat(script({"text": "a b c"}))}
                        )
                    )
                    while not events or events[-1].get("type") not in TERMINAL_TYPES:
                        events.append(json.loads(await ws.get_message()))
                assert events[-1]["type"] == "response.done", events[-1]
                text = "".join(e["text"] for e in events if e["type"] == "text.delta")
                assert text == "a b c"


# An engine fast enough to fill every buffer between the gateway and a client that reads
# nothing (the kernel's socket buffers on loopback grow to megabytes) in a few seconds.
FLOOD_SIM = attrs.evolve(
    FAST_SIM, max_model_len=65536, decode_step_s=0.00005, decode_step_s_per_seq=0.0
)
FLOOD_TOKENS = 40000


async def test_a_client_that_stops_reading_behind_nginx_is_dropped_with_its_upstream() -> None:
    """What proxy_buffering off is for: nginx passes the gateway's backpressure on, so the
    gateway sees a stalled client, drops it after client_stall_timeout_s and closes the
    upstream. With buffering, nginx would read the whole answer into its temp files whatever
    the client does, and vLLM would generate all of it for nobody."""
    async with running_sim(FLOOD_SIM) as sim:
        config = gateway_config(
            provider_toml("sim-a", sim.base_url), server="client_stall_timeout_s = 1.0"
        )
        async with running_gateway(config) as gateway:
            upstream = gateway.base_url.removeprefix("http://")
            async with running_nginx(upstream) as proxy:
                host, _, port = proxy.removeprefix("http://").partition(":")
                sock = trio.socket.socket()
                # A client with a small window, which then reads nothing at all.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                await sock.connect((host, int(port)))
                body = json.dumps(
                    chat(
                        script({"text_tokens": FLOOD_TOKENS}),
                        stream=True,
                        max_tokens=FLOOD_TOKENS,
                    )
                ).encode()
                head = (
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                )
                async with trio.SocketStream(sock) as stalled:
                    await stalled.send_all(head.encode() + body)
                    registry = gateway.router.metrics.registry
                    await wait_until(
                        lambda: bool(
                            registry.get_sample_value(
                                "gateway_cancellations_total", {"cause": "client_stall"}
                            )
                        ),
                        timeout_s=TIMEOUT_S,
                    )
                    await wait_until(lambda: "abort" in sim.engine.stats().finished_by_reason)
                    assert sim.engine.stats().tokens_generated < FLOOD_TOKENS


# --- the dashboard and the alerts ----------------------------------------------------------------


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert exprs
    return exprs


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rules: list[dict[str, Any]] = [rule for group in groups for rule in group["rules"]]
    assert rules
    return rules


def promql(expr: str) -> promql_parser.Expr:
    """Parsed, with Grafana's interval variables replaced by a duration (the label variables
    sit in quoted matchers, already valid PromQL)."""
    return promql_parser.parse(re.sub(r"\$__(rate_interval|interval|range)", "5m", expr))


def selectors(expr: promql_parser.Expr) -> set[str]:
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(expr, visit)
    return names


def test_dashboard_and_alerts_are_valid_promql() -> None:
    for expr in [*dashboard_expressions(), *(rule["expr"] for rule in alert_rules())]:
        names = selectors(promql(expr))
        assert names, expr
        # Every metric is the gateway's (checked against /metrics below) or a known other one:
        # a misspelt name would otherwise just draw an empty panel.
        assert all(GATEWAY_METRIC.fullmatch(n) or n in FOREIGN_METRICS for n in names), names


def test_alert_rules_are_complete() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_dashboard_panels_are_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]


def exposed_families(page: str) -> dict[str, str]:
    """Metric family names (as exposed: counters with `_total`) and their types."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", page, flags=re.MULTILINE))


def used_metrics() -> set[str]:
    used: set[str] = set()
    for path in (DASHBOARD, ALERTS):
        used |= set(GATEWAY_METRIC.findall(path.read_text()))
    return used


async def test_every_metric_used_exists_in_a_running_gateway() -> None:
    used = used_metrics()
    assert len(used) > 20, used
    with trio.fail_after(TIMEOUT_S):
        async with fleet(FAST_SIM, probe=True) as (gateway, _, _), httpx.AsyncClient() as client:
            metrics_url = gateway.base_url + "/metrics"

            async def page() -> str:
                return (await client.get(metrics_url)).text

            # Both replicas probed and scraped: the per-replica and scraped families have
            # samples, not only names.
            text = ""
            while text.count("gateway_upstream_kv_cache_usage{") < 2:
                text = await page()
                await trio.sleep(0.05)
            # Requests (a long prompt twice, so the prefix cache hits), so counters and
            # histograms have samples too.
            long_prompt = " ".join(f"word{i}" for i in range(300))
            for _ in range(2):
                response = await client.post(
                    gateway.base_url + "/v1/chat/completions",
                    json=chat(long_prompt + script({"text": "ok"}), stream=True),
                    headers={"x-session-id": "metrics"},
                )
                assert response.status_code == 200
            while "gateway_prefix_cache_hit_ratio{" not in text or (
                "gateway_time_to_first_token_seconds_bucket{" not in text
            ):
                text = await page()
                await trio.sleep(0.05)
    families = exposed_families(text)
    missing = set()
    for name in used:
        family = name
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and families.get(name.removesuffix(suffix)) == "histogram":
                family = name.removesuffix(suffix)
        if family not in families:
            missing.add(name)
    assert not missing, f"used in deploy/ but not exported: {sorted(missing)}"
