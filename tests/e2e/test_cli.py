"""The console script as a user runs it: the default config, signals, bad configs, busy ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from openai import OpenAI

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "trio_gateway"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def default_config_on_free_ports(tmp_path: Path) -> tuple[Path, int]:
    gateway_port, sim_port = free_port(), free_port()
    text = (REPO / "gateway.toml").read_text()
    text = text.replace("127.0.0.1:8080", f"127.0.0.1:{gateway_port}")
    text = text.replace("127.0.0.1:8001", f"127.0.0.1:{sim_port}")
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path, gateway_port


def wait_ready(port: int, proc: subprocess.Popen[str], timeout_s: float = 20) -> None:
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
    assert "cannot serve: [Errno 98] Address already in use" in result.stderr
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
