"""Stopping a real ``serve`` the ways docs/operations.md says: ``trio-gateway stop`` (``pidof``
finds nothing: the process is ``python3 .../trio-gateway``), and Ctrl-C, twice when the drain
is too long to wait for."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.e2e.test_cli import CLI, REPO, default_config_on_free_ports, wait_ready


@contextmanager
def slow_gateway(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    """``serve`` of the starter config whose simulator takes 0.5 s a token: an answer runs
    for minutes, and the drain (30 s) would wait for it."""
    config, port = default_config_on_free_ports(tmp_path)
    config.write_text(config.read_text().replace("decode_step_s = 0.02", "decode_step_s = 0.5"))
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_ready(port, proc)
        yield proc, port, config
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@contextmanager
def a_running_answer(port: int) -> Iterator[None]:
    body = {
        "model": "agent-lite",
        "stream": True,
        "max_tokens": 2000,
        "messages": [{"role": "user", "content": "hello"}],
    }
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        # Kept while the answer runs: a dropped iterator would close the stream.
        lines = response.iter_lines()
        next(lines)  # the answer has begun
        yield


def readyz(port: int) -> tuple[int, str]:
    response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    return response.status_code, response.json()["status"]


def wait_draining(port: int) -> None:
    deadline = time.monotonic() + 10
    while readyz(port) != (503, "draining"):
        assert time.monotonic() < deadline, "the drain did not begin"
        time.sleep(0.02)


def stop(config: Path) -> subprocess.CompletedProcess[str]:
    # As docs/operations.md runs it: from the config's directory, by its name.
    return subprocess.run(
        [*CLI, "stop", "--config", config.name],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=config.parent,
    )


def test_stop_drains_the_gateway_of_a_config_as_the_docs_say(tmp_path: Path) -> None:
    operations = (REPO / "docs" / "operations.md").read_text()
    assert "$ trio-gateway stop --config gateway.toml ; curl -s -w" in operations
    assert "$(pidof trio-gateway)" not in operations
    with slow_gateway(tmp_path) as (proc, port, config), a_running_answer(port):
        stopped = stop(config)
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout == f"sent SIGTERM to pid {proc.pid}: it drains, then exits\n"
        # The listener stays open while the answer runs: a load balancer sees the drain.
        wait_draining(port)
        assert proc.poll() is None
        # A second stop ends the drain at once.
        assert stop(config).returncode == 0
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "SIGTERM: draining for up to 30 s (a second SIGTERM stops at once)" in err
    assert "SIGTERM again: stopping at once" in err
    # Nothing of that config serves any more: said, with what to do.
    again = stop(config)
    assert again.returncode == 1
    assert "no `trio-gateway serve --config gateway.toml` runs on this host" in again.stderr


def test_a_second_ctrl_c_stops_a_long_drain_at_once(tmp_path: Path) -> None:
    with slow_gateway(tmp_path) as (proc, port, _), a_running_answer(port):
        proc.send_signal(signal.SIGINT)
        wait_draining(port)
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
        took_s = time.monotonic() - began
    assert proc.returncode == 0, err
    # The drain had 30 s to go and an answer of minutes running.
    assert took_s < 5, took_s
    assert "SIGINT: draining for up to 30 s (a second Ctrl-C stops at once)" in err
    assert "SIGINT again: stopping at once" in err
    assert "Traceback" not in err
