"""Run a real vLLM (CPU build, tiny random Qwen3) as a subprocess for tests.

    with running_vllm() as server:
        httpx.get(f"{server.root_url}/health")
        httpx.post(f"{server.base_url}/chat/completions", headers=server.auth_headers, ...)

`running_vllm` makes sure the vLLM venv exists (tools/vllm/setup.sh, minutes the first time,
instant after), builds the tiny model if needed (tools/vllm/build_model.py, seconds), starts
tools/vllm/serve.py in its own process group, waits until /health answers *and* a real
1-token generation succeeds, and on exit stops the whole process group (SIGTERM, then SIGKILL
after a grace period) and checks that no process of it is left.

Set TRIO_GATEWAY_VLLM_URL (e.g. http://127.0.0.1:8000) and TRIO_GATEWAY_VLLM_API_KEY to use a
server that is already running instead (then `pid` is None and nothing is started or stopped).

This module runs in the gateway's venv: it only uses the standard library and httpx.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / "tools" / "vllm"
SERVED_MODEL_NAME = "qwen3-32b"
MAX_MODEL_LEN = 2048
SETUP_TIMEOUT_S = 30 * 60.0
BUILD_TIMEOUT_S = 10 * 60.0
STARTUP_TIMEOUT_S = 240.0
STOP_GRACE_S = 20.0


class VllmStartError(RuntimeError):
    """vLLM could not be installed, built or started; the message has the log's tail."""


@dataclass(frozen=True)
class VllmServer:
    root_url: str  # http://127.0.0.1:PORT (/health, /metrics, /load live here)
    api_key: str
    pid: int | None  # the serve.py process, leader of its own process group
    served_model_name: str = SERVED_MODEL_NAME
    max_model_len: int = MAX_MODEL_LEN
    log_path: Path | None = None
    startup_s: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, with /v1."""
        return f"{self.root_url}/v1"

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def _clean_env() -> dict[str, str]:
    """The environment for the vLLM venv's processes: none of the gateway venv leaks in."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    }
    if not env.get("VLLM_CPU_KVCACHE_SPACE", "x").strip():
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # empty breaks vLLM; unset is fine
    return env


def _run_tool(cmd: list[str], timeout: float, what: str) -> str:
    """Run a setup step; return the last line of its stdout (a path)."""
    try:
        done = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise VllmStartError(f"{what} took more than {timeout:.0f} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-40:])
        raise VllmStartError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return lines[-1].strip()


def ensure_vllm_env() -> Path:
    """Install (or reuse) the cached vLLM venv; return its python."""
    return Path(_run_tool(["bash", str(TOOLS_DIR / "setup.sh")], SETUP_TIMEOUT_S, "setup.sh"))


def ensure_model(python: Path) -> Path:
    """Build (or reuse) the tiny Qwen3 model; return its directory."""
    cmd = [str(python), str(TOOLS_DIR / "build_model.py")]
    return Path(_run_tool(cmd, BUILD_TIMEOUT_S, "build_model.py"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _log_tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def group_pids(pgid: int, *, zombies: bool = False) -> list[int]:
    """PIDs of the processes in a process group (live ones only, unless zombies), from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces or parens.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and (zombies or fields[0] != "Z"):
            pids.append(int(entry.name))
    return pids


def group_rss_mb(pgid: int) -> float:
    """Resident memory of a process group, summed over its processes (MiB)."""
    total_kb = 0
    for pid in group_pids(pgid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total_kb += int(line.split()[1])
    return total_kb / 1024


def stop_group(proc: subprocess.Popen[bytes], grace: float = STOP_GRACE_S) -> None:
    """Stop serve.py and everything it started; leave nothing behind.

    SIGTERM goes to the leader only, so vLLM shuts its engine and worker down in its own
    order (0.4-2.4 s here); whatever is left of the group after `grace` seconds gets SIGKILL.
    Children that exit after their parent stay zombies until init reaps them, a moment later.
    """
    pgid = proc.pid  # started with start_new_session=True: pid == pgid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()
        if proc.returncode is not None and not group_pids(pgid):
            _wait_reaped(pgid)
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = group_pids(pgid)
    if left:
        raise RuntimeError(f"vLLM processes survived SIGKILL: {left}")
    _wait_reaped(pgid)


def _wait_reaped(pgid: int, within: float = 10.0) -> None:
    """Children that outlived their parent are reaped by init, a moment later: wait for it."""
    deadline = time.monotonic() + within
    while group_pids(pgid, zombies=True) and time.monotonic() < deadline:
        time.sleep(0.1)


# `vllm serve --runner pooling --convert embed`: the tiny Qwen3 as an embedding model (its
# last hidden state, normalised: 128 floats), serving /v1/embeddings and no generation.
# float32: in bfloat16 vLLM's CPU attention takes its AMX kernel where the CPU names AMX,
# and on a Sapphire Rapids VM whose kernel does not grant the tiles the pooling pass dies of
# SIGILL in cpu_attention_with_kv_cache (the generating server does not reach it).
POOLING_ARGS = ["--runner", "pooling", "--convert", "embed", "--dtype", "float32"]


def wait_ready(
    root_url: str,
    api_key: str,
    proc: subprocess.Popen[bytes] | None,
    log_path: Path | None,
    timeout: float = STARTUP_TIMEOUT_S,
    *,
    pooling: bool = False,
) -> None:
    """Wait for /health and then for a real 1-token generation (an embedding, for a pooling
    model) to succeed."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"

    def fail(why: str) -> VllmStartError:
        tail = _log_tail(log_path) if log_path else ""
        return VllmStartError(f"vLLM not ready: {why}\n--- log tail ({log_path}) ---\n{tail}")

    with httpx.Client(timeout=10.0) as client:
        healthy = False
        while True:
            if proc is not None and proc.poll() is not None:
                raise fail(f"serve.py exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise fail(f"not ready after {timeout:.0f} s ({last})")
            try:
                if not healthy:
                    r = client.get(f"{root_url}/health")
                    healthy = r.status_code == 200
                    last = f"/health -> {r.status_code}"
                if healthy and pooling:
                    r = client.post(
                        f"{root_url}/v1/embeddings",
                        headers={"Authorization": f"Bearer {api_key}"},
                        json={"model": SERVED_MODEL_NAME, "input": "ping"},
                        timeout=60.0,
                    )
                    last = f"an embedding -> {r.status_code} {r.text[:200]}"
                    if r.status_code == 200 and r.json()["data"][0]["embedding"]:
                        return
                elif healthy:
                    r = client.post(
                        f"{root_url}/v1/chat/completions",
                        headers={"Authorization": f"Bearer {api_key}"},
                        json={
                            "model": SERVED_MODEL_NAME,
                            "messages": [{"role": "user", "content": "ping"}],
                            "max_tokens": 1,
                            "chat_template_kwargs": {"enable_thinking": False},
                        },
                        timeout=60.0,
                    )
                    last = f"1-token generation -> {r.status_code} {r.text[:200]}"
                    if r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1:
                        return
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5)


@contextlib.contextmanager
def running_vllm(
    *,
    port: int | None = None,
    api_key: str | None = None,
    max_num_seqs: int = 4,
    step_delay_ms: float | None = None,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    extra_args: list[str] | None = None,
    pooling: bool = False,
    cpus: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[VllmServer]:
    """Start a real vLLM for the duration of the block (see the module docstring).

    pooling serves the model as an embedding model (POOLING_ARGS); it is always started here,
    TRIO_GATEWAY_VLLM_URL names a generating server only.

    step_delay_ms paces the engine (serve.py's --step-delay-ms, default 20 ms per decode
    step, ~45 tokens/s per sequence); 0 runs the tiny model at full speed, where the engine
    outruns vLLM's own API server on 2 cores and streams arrive in bursts.

    cpus pins every process of the server (API server, engine core, worker) to those cores:
    `taskset` before serve.py (children inherit it), and vLLM's own OpenMP binding told the
    same (VLLM_CPU_OMP_THREADS_BIND, whose default "auto" picks cores by itself). The
    cancellation benchmark on real vLLM (bench/cancellation_vllm.py) gives it one core.

    env is added to the server's environment (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, say).
    """
    external = os.environ.get("TRIO_GATEWAY_VLLM_URL")
    if external and not pooling:
        key = os.environ.get("TRIO_GATEWAY_VLLM_API_KEY", "")
        wait_ready(external.rstrip("/"), key, None, None, startup_timeout)
        yield VllmServer(root_url=external.rstrip("/"), api_key=key, pid=None)
        return

    python = ensure_vllm_env()
    model = ensure_model(python)
    port = port or free_port()
    api_key = api_key or f"test-{secrets.token_hex(8)}"
    fd, log_name = tempfile.mkstemp(prefix=f"trio-gateway-vllm-{port}-", suffix=".log")
    log_path = Path(log_name)
    environ = _clean_env() | dict(env or {})
    pin: list[str] = []
    if cpus:
        listed = ",".join(str(c) for c in cpus)
        pin = ["taskset", "-c", listed]
        environ["VLLM_CPU_OMP_THREADS_BIND"] = listed
    cmd = [
        *pin,
        str(python),
        str(TOOLS_DIR / "serve.py"),
        "--port",
        str(port),
        "--api-key",
        api_key,
        "--max-num-seqs",
        str(max_num_seqs),
        "--model",
        str(model),
    ]
    if step_delay_ms is not None:
        cmd += ["--step-delay-ms", str(step_delay_ms)]
    extra_args = [*(extra_args or []), *(POOLING_ARGS if pooling else [])]
    if extra_args:
        cmd += ["--", *extra_args]
    started = time.monotonic()
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: the engine's children die with it
        )
    try:
        wait_ready(
            f"http://127.0.0.1:{port}", api_key, proc, log_path, startup_timeout, pooling=pooling
        )
        startup_s = time.monotonic() - started
        print(
            f"\n[vllm] ready in {startup_s:.1f} s on port {port}, pid {proc.pid}, log {log_path}",
            file=sys.stderr,
        )
        yield VllmServer(
            root_url=f"http://127.0.0.1:{port}",
            api_key=api_key,
            pid=proc.pid,
            log_path=log_path,
            startup_s=startup_s,
            extra={"model": str(model), "python": str(python)},
        )
    finally:
        stop_group(proc)
