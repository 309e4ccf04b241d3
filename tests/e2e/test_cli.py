"""The console script as a user runs it: the default config, signals, bad configs, busy ports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from importlib.resources import files
from pathlib import Path

import httpx
import pytest
import tomli
from bench.processes import free_port
from openai import OpenAI

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "trio_gateway"]


def default_config_on_free_ports(tmp_path: Path) -> tuple[Path, int]:
    gateway_port, sim_port = free_port(), free_port()
    text = (REPO / "gateway.toml").read_text()
    text = text.replace("127.0.0.1:8080", f"127.0.0.1:{gateway_port}")
    text = text.replace("127.0.0.1:8001", f"127.0.0.1:{sim_port}")
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path, gateway_port


def wait_ready(
    port: int, proc: subprocess.Popen[str] | subprocess.Popen[bytes], timeout_s: float = 20
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError("the gateway did not become ready")


def test_default_config_serves_the_sdk_and_stops_on_sigterm(tmp_path: Path) -> None:
    config, port = default_config_on_free_ports(tmp_path)
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_ready(port, proc)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        text = []
        for chunk in client.chat.completions.create(
            model="agent-lite",
            messages=[{"role": "user", "content": "hello"}],
            stream=True,
            max_tokens=12,
        ):
            for choice in chunk.choices:
                text.append(choice.delta.content or getattr(choice.delta, "reasoning_content", ""))
        assert "".join(t or "" for t in text).strip()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert "draining" in err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_busy_port_is_one_clear_line(tmp_path: Path) -> None:
    config, port = default_config_on_free_ports(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        result = subprocess.run(
            [*CLI, "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=20,
            cwd=tmp_path,
        )
    assert result.returncode == 1
    assert (
        f"cannot serve: cannot listen on 127.0.0.1:{port} (server.listen in the config): "
        "Address already in use" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_busy_simulator_port_names_the_simulator(tmp_path: Path) -> None:
    config, _ = default_config_on_free_ports(tmp_path)
    sim_listen = tomli.loads(config.read_text())["simulators"]["local-vllm"]["listen"]
    host, port = sim_listen.rsplit(":", 1)
    with socket.socket() as busy:
        busy.bind((host, int(port)))
        busy.listen()
        result = subprocess.run(
            [*CLI, "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=20,
            cwd=tmp_path,
        )
    assert result.returncode == 1
    assert (
        f"cannot listen on {sim_listen} (simulators.local-vllm.listen in the config): "
        "Address already in use" in result.stderr
    ), result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_config_does_not_start(tmp_path: Path) -> None:
    bad = tmp_path / "gateway.toml"
    bad.write_text("[server]\nlisten = 8080\n[aliases.a]\nproviders = []\n")
    result = subprocess.run(
        [*CLI, "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ},
    )
    assert result.returncode == 2
    assert f"{bad}: server.listen: expected a string, got 8080" in result.stderr
    assert "Traceback" not in result.stderr


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=20, cwd=cwd)


def test_version_is_the_package_version(tmp_path: Path) -> None:
    result = run("--version", cwd=tmp_path)
    assert result.returncode == 0
    version = tomli.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert result.stdout.strip() == f"trio-gateway {version}"


def test_an_unknown_log_level_is_refused_with_the_choices(tmp_path: Path) -> None:
    result = run("serve", "--log-level", "verbose", cwd=tmp_path)
    assert result.returncode == 2
    assert "invalid choice: 'verbose'" in result.stderr
    assert "'debug', 'info', 'warning', 'error', 'critical'" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_without_a_config_points_to_init(tmp_path: Path) -> None:
    result = run("serve", cwd=tmp_path)
    assert result.returncode == 2
    assert "no gateway.toml here; write one with `trio-gateway init`" in result.stderr


def test_init_writes_the_default_config_and_keeps_an_existing_one(tmp_path: Path) -> None:
    packaged = files("trio_gateway").joinpath("default_gateway.toml")
    # The declared package data is real, and it is the repository's default.
    assert packaged.read_text() == (REPO / "gateway.toml").read_text()
    result = run("init", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = tmp_path / "gateway.toml"
    assert written.read_text() == (REPO / "gateway.toml").read_text()
    assert run("check", cwd=tmp_path).returncode == 0
    written.write_text("# mine\n")
    again = run("init", cwd=tmp_path)
    assert again.returncode == 1
    assert "exists; keeping it" in again.stderr
    assert written.read_text() == "# mine\n"
    assert run("init", "--force", str(written), cwd=tmp_path).returncode == 0
    assert written.read_text() == (REPO / "gateway.toml").read_text()


def test_the_wheel_make_builds_holds_the_command_and_the_starter_config(tmp_path: Path) -> None:
    # No package named trio-gateway is on PyPI: README and deployment.md install from a
    # checkout (`pip install .`) or from the wheel `make wheel` builds; this is its recipe.
    recipe = (REPO / "Makefile").read_text().split("\nwheel:", 1)[1].split("\n\n", 1)[0]
    assert "pip wheel --quiet --no-deps --wheel-dir dist ." in recipe
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir"]
    built = subprocess.run(
        [*pip_wheel, str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("trio_gateway-*-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "trio_gateway/default_gateway.toml" in names
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "trio-gateway = trio_gateway.cli.main:main" in archive.read(entry_points).decode()


def test_listen_overrides_the_config(tmp_path: Path) -> None:
    config, config_port = default_config_on_free_ports(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [
            *CLI,
            "serve",
            "--config",
            str(config),
            "--listen",
            f"127.0.0.1:{port}",
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_ready(port, proc)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{config_port}/readyz", timeout=1)
        models = httpx.get(
            f"http://127.0.0.1:{port}/v1/models", headers={"x-request-id": "cli-1"}, timeout=5
        )
        assert models.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    # --log-format json: every line is one JSON object, for log shippers.
    lines = [json.loads(line) for line in err.splitlines()]
    assert any(f"serving on http://127.0.0.1:{port}" in line.get("message", "") for line in lines)
    (access,) = [line for line in lines if line["logger"] == "trio_gateway.access"]
    assert (access["request_id"], access["route"], access["status"]) == (
        "cli-1",
        "GET /v1/models",
        200,
    )


def test_listen_elsewhere_than_loopback_needs_auth(tmp_path: Path) -> None:
    config, _ = default_config_on_free_ports(tmp_path)
    config.write_text(config.read_text().replace("[auth]\nopen = true\n", ""))
    result = run("serve", "--config", str(config), "--listen", "0.0.0.0:1", cwd=tmp_path)
    assert result.returncode == 2
    assert "auth: --listen '0.0.0.0:1' is not a loopback address" in result.stderr
