"""Child processes for benchmarks: start one, wait until it answers, always stop it.

Benchmarks run the simulator, the gateway and the baseline proxy each in its own process, the way
they run in production, so that no component's CPU time is counted against another's event loop.
Every wait here has a deadline; every process started is stopped (SIGTERM, then SIGKILL) when its
``with`` block ends, whatever happened inside.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import httpx

# The interpreter running the benchmark: the project's venv when run as `.venv/bin/python -m ...`.
PYTHON = sys.executable
READY_TIMEOUT_S = 30.0
READY_POLL_S = 0.05
STOP_TIMEOUT_S = 15.0
KILL_TIMEOUT_S = 5.0
LOG_TAIL_LINES = 40


class ProcessFailed(Exception):
    """A child process did not start, or died while it was needed."""


def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _quiet_range() -> tuple[int, int]:
    """Ports 10000 up to the ephemeral range; under pytest-xdist, this worker's share of them:
    a port chosen free is not held until the child binds it, and another test process choosing
    the same one in between would take it."""
    start, end = 10_000, max(ephemeral_low(), 10_001)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or "1")
    if workers > 1 and worker.startswith("gw") and worker[2:].isdigit():
        share = (end - start) // workers
        start += int(worker[2:]) * share
        end = start + share
    return start, end


def quiet_ports(count: int) -> list[int]:
    """``count`` distinct ports nobody holds now, below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` is in the ephemeral range, which every outgoing
    connection on this machine draws from too: between choosing it and a child process binding
    it (seconds, for the gateway's imports on a busy machine) a load generator's connection or
    another test's server may take it. CI saw a simulator fail with EADDRINUSE that way, and
    once ``/healthz`` answered on the gateway's port before the gateway listened.
    """
    start, end = _quiet_range()
    chosen: list[int] = []
    rng = random.Random()
    while len(chosen) < count:
        port = rng.randrange(start, end)
        if port in chosen:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
    return chosen


def free_port() -> int:
    """A port for a child process to listen on (see ``quiet_ports``)."""
    return quiet_ports(1)[0]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@attrs.define
class Child:
    name: str
    argv: tuple[str, ...]
    log_path: Path
    process: subprocess.Popen[bytes]
    exit_code: int | None = None  # set once stopped
    killed: bool = False  # SIGTERM was not enough

    def cpu_seconds(self) -> float | None:
        """User + system CPU time used so far (Linux /proc), None if unavailable."""
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except OSError:
            return None
        # Fields after the command name (which may hold spaces) start at field 3.
        fields = stat.rsplit(")", 1)[1].split()
        utime, stime = int(fields[11]), int(fields[12])
        return (utime + stime) / os.sysconf("SC_CLK_TCK")

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise ProcessFailed(
                f"{self.name} exited with status {code}; last lines of {self.log_path}:\n"
                + log_tail(self.log_path)
            )


def _wait_ready(child: Child, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            child.check_alive()
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(READY_POLL_S)
    raise ProcessFailed(f"{child.name} did not answer {url} within {timeout_s:g} s")


def _stop(child: Child) -> None:
    stop_all([child])


def stop_all(children: Sequence[Child]) -> None:
    """SIGTERM to every child at once, then SIGKILL to those still running after
    ``STOP_TIMEOUT_S``: a stack of processes, each draining its own connections, stops in the
    time of the slowest, not of all of them one after another."""
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in children:
        process = child.process
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.killed = True
            print(f"{child.name}: SIGKILL, {STOP_TIMEOUT_S:g} s after SIGTERM", file=sys.stderr)
            process.kill()
            process.wait(timeout=KILL_TIMEOUT_S)
        child.exit_code = process.returncode


@contextlib.contextmanager
def running(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    ready_url: str,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> Iterator[Child]:
    """Start ``argv`` (output to ``log_path``), wait until ``ready_url`` answers 200, yield;
    on the way out stop it, gracefully if it lets itself be stopped."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    child = Child(name=name, argv=tuple(argv), log_path=log_path, process=process)
    try:
        _wait_ready(child, ready_url, ready_timeout_s)
        yield child
    finally:
        _stop(child)
