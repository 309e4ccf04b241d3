"""``[server] workers = N`` (workers.py): a supervisor and N gateway processes on one port,
run as a user runs them (`trio-gateway serve`), with the embedded simulator as upstream."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
from bench.processes import free_port

from tests.e2e.test_cli import CLI, wait_ready

STOP_TIMEOUT_S = 20


def config_text(gateway_port: int, sim_port: int, *, workers: int, max_inflight: int) -> str:
    return f"""
[server]
listen = "127.0.0.1:{gateway_port}"
workers = {workers}
drain_timeout_s = 5.0

[simulators.sim]
listen = "127.0.0.1:{sim_port}"
served_model_name = "m"
max_num_seqs = 64
decode_step_s = 0.01

[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "sim"
type = "openai_compatible"
base_url = "http://127.0.0.1:{sim_port}/v1"
model = "m"
max_inflight = {max_inflight}
queue_timeout_s = 30.0
probe = false
"""


@contextmanager
def supervisor(
    tmp_path: Path, *, workers: int = 2, max_inflight: int = 8
) -> Iterator[tuple[subprocess.Popen[str], int, int, Path]]:
    port, sim_port = free_port(), free_port()
    path = tmp_path / "gateway.toml"
    path.write_text(config_text(port, sim_port, workers=workers, max_inflight=max_inflight))
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [*CLI, "serve", "--config", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
    try:
        wait_ready(port, proc)
        yield proc, port, sim_port, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def worker_pids(port: int, *, at_least: int, timeout_s: float = 20) -> set[int]:
    """The pids that answer /healthz on a new connection each time, until ``at_least`` seen."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < at_least and time.monotonic() < deadline:
        try:
            seen.add(httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()["pid"])
        except httpx.TransportError:
            time.sleep(0.05)
    return seen


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by the supervisor's parent) is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_for(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def chat(port: int, tokens: int = 5) -> int:
    body = {
        "model": "agent-lite",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": True,
    }
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r,
    ):
        text = "".join(r.iter_text())
    assert text.rstrip().endswith("data: [DONE]"), text[-300:]
    return r.status_code


def test_workers_share_one_port_reload_on_sighup_and_drain_on_sigterm(tmp_path: Path) -> None:
    with supervisor(tmp_path) as (proc, port, _, log):
        pids = worker_pids(port, at_least=2)
        assert len(pids) == 2 and proc.pid not in pids, pids
        assert chat(port) == 200
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: log.read_text().count("applied: ") == 2, 20), log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT_S) == 0
        assert all(not alive(pid) for pid in pids)
        text = log.read_text()
        assert text.count("draining for up to 5 s") == 2, text
        assert "Traceback" not in text


def test_without_redis_the_workers_share_max_inflight(tmp_path: Path) -> None:
    """max_inflight 8 over 2 workers, shared through the supervisor: 24 streams at once run 8,
    never more; reloaded to 4, 4 (test_workers_share.py has the rest of the sharing)."""
    with supervisor(tmp_path, max_inflight=8) as (proc, port, sim_port, log):
        sim = f"http://127.0.0.1:{sim_port}/sim"
        for limit in (8, 4):
            with ThreadPoolExecutor(24) as pool:
                statuses = list(pool.map(lambda _: chat(port, tokens=40), range(24)))
            assert statuses == [200] * 24
            stats = httpx.get(sim + "/stats").json()
            assert stats["requests"] == 24
            assert stats["max_running_seen"] == limit, (limit, stats)
            if limit == 8:
                httpx.post(sim + "/reset")
                path = tmp_path / "gateway.toml"
                path.write_text(path.read_text().replace("max_inflight = 8", "max_inflight = 4"))
                proc.send_signal(signal.SIGHUP)
                assert wait_for(lambda: log.read_text().count("1 resized") == 2, 20)


def test_a_worker_that_dies_is_started_again(tmp_path: Path) -> None:
    with supervisor(tmp_path) as (_, port, _, log):
        pids = worker_pids(port, at_least=2)
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: "exited with -9; starting it again" in log.read_text(), 20)
        fresh = worker_pids(port, at_least=2)
        assert victim not in fresh and len(fresh) == 2, (pids, fresh)
        assert chat(port) == 200


def test_a_killed_supervisor_takes_its_workers_along(tmp_path: Path) -> None:
    with supervisor(tmp_path) as (proc, port, _, log):
        pids = worker_pids(port, at_least=2)
        proc.kill()
        proc.wait()
        assert wait_for(lambda: not any(alive(pid) for pid in pids), STOP_TIMEOUT_S), pids
        assert log.read_text().count("supervisor gone: draining") == 2


def test_trio_gateway_reload_checks_the_file_then_signals_the_gateway(tmp_path: Path) -> None:
    with supervisor(tmp_path, workers=1) as (proc, port, _, log):
        path = tmp_path / "gateway.toml"
        good = path.read_text()
        path.write_text(good.replace("max_inflight = 8", 'max_inflight = "eight"'))
        bad = subprocess.run(
            [*CLI, "reload", "--config", str(path)], capture_output=True, text=True, check=False
        )
        assert bad.returncode == 2, bad
        assert "max_inflight" in bad.stderr and "no reload sent" in bad.stderr
        assert "applied" not in log.read_text()
        path.write_text(good.replace("agent-lite", "agent-max"))
        ok = subprocess.run(
            [*CLI, "reload", "--config", str(path)], capture_output=True, text=True, check=False
        )
        assert ok.returncode == 0, ok
        assert f"sent SIGHUP to pid {proc.pid}\n" in ok.stdout
        assert wait_for(lambda: "applied: " in log.read_text(), 20), log.read_text()
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["agent-max"]
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'gateway_config_reloads_total{result="applied"} 1.0' in metrics


def test_trio_gateway_reload_without_a_running_gateway_says_so(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(config_text(free_port(), free_port(), workers=1, max_inflight=8))
    result = subprocess.run(
        [*CLI, "reload", "--config", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert "runs on this host; give --pid PID" in result.stderr


@contextmanager
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    """systemd's end of sd_notify: a datagram socket that also tells each sender's pid."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.settimeout(20)
    try:
        yield sock
    finally:
        sock.close()


def receive(sock: socket.socket) -> tuple[int, dict[str, str]]:
    """One message: the sender's pid, and its KEY=VALUE lines."""
    data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(12))
    pid = -1
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("3i", payload[:12])[0]
    fields = dict(line.split("=", 1) for line in data.decode().splitlines())
    return pid, fields


def test_systemd_hears_ready_reloading_and_stopping_from_the_main_process(
    tmp_path: Path,
) -> None:
    for workers in (1, 2):
        port, sim_port = free_port(), free_port()
        path = tmp_path / f"gateway-{workers}.toml"
        path.write_text(config_text(port, sim_port, workers=workers, max_inflight=8))
        with notify_socket(_fresh(tmp_path / f"w{workers}")) as sock:
            env = {**os.environ, "NOTIFY_SOCKET": sock.getsockname()}
            proc = subprocess.Popen(
                [*CLI, "serve", "--config", str(path)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            try:
                pid, ready = receive(sock)
                assert (pid, ready["READY"]) == (proc.pid, "1"), ready
                wait_ready(port, proc)
                if workers == 1:
                    proc.send_signal(signal.SIGHUP)
                    pid, message = receive(sock)
                    assert (pid, message["RELOADING"]) == (proc.pid, "1")
                    assert int(message["MONOTONIC_USEC"]) > 0
                    pid, message = receive(sock)
                    assert (pid, message["READY"]) == (proc.pid, "1")
                    assert message["STATUS"].endswith("last reload applied")
                proc.send_signal(signal.SIGTERM)
                pid, message = receive(sock)
                assert (pid, message["STOPPING"]) == (proc.pid, "1")
                assert proc.wait(STOP_TIMEOUT_S) == 0
                # Workers say nothing to systemd: their supervisor is the unit's main process.
                sock.settimeout(0.5)
                try:
                    extra = receive(sock)
                except TimeoutError:
                    extra = None
                assert extra is None, extra
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def _fresh(path: Path) -> Path:
    path.mkdir()
    return path


def test_auto_starts_one_worker_per_core_the_process_may_use(tmp_path: Path) -> None:
    """``workers = "auto"`` pinned to one core is one process (no supervisor); pinned to two,
    a supervisor and two workers (process/cores.py reads the affinity and cgroup quota)."""
    cpus = sorted(os.sched_getaffinity(0))
    for pinned in ([cpus[0]], cpus[:2]) if len(cpus) >= 2 else ([cpus[0]],):
        port, sim_port = free_port(), free_port()
        path = tmp_path / f"auto-{len(pinned)}.toml"
        text = config_text(port, sim_port, workers=1, max_inflight=8)
        path.write_text(text.replace("workers = 1", 'workers = "auto"'))
        proc = subprocess.Popen(
            ["taskset", "-c", ",".join(map(str, pinned)), *CLI, "serve", "--config", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_ready(port, proc)
            pids = worker_pids(port, at_least=len(pinned))
            expected = {proc.pid} if len(pinned) == 1 else None
            assert len(pids) == len(pinned), pids
            assert expected is None or pids == expected
            assert len(pinned) == 1 or proc.pid not in pids
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(STOP_TIMEOUT_S) == 0
