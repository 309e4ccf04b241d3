"""What every scenario of the suite shares: the modes, the processes, the numbers.

One run of a scenario starts one simulator (``bench/sim_server.py``, configured for the
scenario), one naive proxy and one gateway (a generated config: one alias, one
``openai_compatible`` provider pointing at the simulator, probes off), all three at once, and
then runs the same load three ways, one mode after another:

- ``direct``: the load generator talks to the simulator;
- ``naive``: through ``bench/naive_proxy.py`` (trio + hypercorn + httpx, no logic);
- ``gateway``: through ``trio-gateway serve``.

A and B add ``nginx``: a real nginx as a pass-through reverse proxy (``bench/nginx_proxy.py``),
the C reference; A adds ``gateway-w2``: the same gateway with ``[server] workers = 2``. A
scenario names the modes it runs (``add_common(parser, modes)``) and refuses others.

Between modes the simulator's counters are reset (``POST /sim/reset``) after it went idle, so
each mode's counters are its own. The load generator is the benchmark process itself, never the
process measured; the proxy's and the gateway's CPU, RSS and file descriptors are read from /proc
(``bench/procstat.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from bench import nginx_proxy, otlp_sink
from bench.processes import PYTHON, Child, ProcessFailed, _wait_ready, free_port, stop_all
from bench.procstat import Sampler, connections, loadavg, raise_nofile_limit

# Re-exported: every scenario reaches them through the harness.
from bench.settings import ALIAS as ALIAS
from bench.settings import SERVED_MODEL as SERVED_MODEL
from bench.settings import GatewaySettings as GatewaySettings
from bench.settings import SimSettings as SimSettings
from bench.settings import gateway_toml as gateway_toml

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
PLOTS_DIR = ROOT / "docs" / "bench"
MODES = ("direct", "naive", "gateway")
NGINX_MODE = "nginx"
GATEWAY_W2 = "gateway-w2"
LABELS = {
    "direct": "direct",
    "naive": "naive proxy",
    NGINX_MODE: "nginx",
    "gateway": "trio-gateway",
    GATEWAY_W2: "trio-gateway, 2 workers",
}
# Where the modes beyond the three run, for the refusal of the others.
RUN_IN = {NGINX_MODE: "A and B (overhead, stream_timing)", GATEWAY_W2: "A and D (overhead, scale)"}
# A mode a scenario may add after the three: a second gateway, configured otherwise
# (``run_scenario(variants=...)``), run in the same stack as the first for a like-for-like row.
FILTERED = "gateway+filter"
LABELS[FILTERED] = "trio-gateway + filter"
CHAT_PATH = "/v1/chat/completions"
HTTP_TIMEOUT_S = 10.0


@attrs.frozen(kw_only=True)
class Common:
    """The flags every scenario takes."""

    modes: tuple[str, ...]
    smoke: bool
    plots: bool
    results_dir: Path
    plots_dir: Path
    gateway_log_level: str
    gateway_tracing: float | None = None  # [tracing]'s sample ratio in every gateway; None: off
    # Modes of the default set this machine cannot run, and why (nginx not installed).
    skipped: Mapping[str, str] = attrs.field(factory=dict)
    # Cores (taskset) for the gateways (every gateway mode, workers included), and for
    # everything else: the load generator (this process), the upstream, the proxies. None:
    # wherever the kernel puts them.
    gateway_cpus: tuple[int, ...] | None = None
    others_cpus: tuple[int, ...] | None = None


def _cpus(text: str) -> tuple[int, ...]:
    """``0,2-3`` -> (0, 2, 3), as taskset -c reads it."""
    cpus: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return tuple(cpus)


def add_common(parser: argparse.ArgumentParser, modes: Sequence[str] = MODES) -> None:
    parser.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated subset of {', '.join(modes)} (default: all of them; nginx "
        "left out, with a note, where /usr/sbin/nginx is missing)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes: checks that the scenario runs"
    )
    parser.add_argument(
        "--no-plots", action="store_true", help="no PNGs (and no matplotlib needed)"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="JSON goes here")
    parser.add_argument("--plots-dir", type=Path, default=PLOTS_DIR, help="PNGs go here")
    parser.add_argument(
        "--gateway-log-level",
        default="info",
        help="trio-gateway serve --log-level (info, the default, logs one access line a request)",
    )
    otlp_sink.add_flag(parser)
    parser.add_argument(
        "--gateway-cpus",
        type=_cpus,
        default=None,
        help="pin every gateway (and its workers) to these cores, e.g. 0,1 (taskset -c)",
    )
    parser.add_argument(
        "--others-cpus",
        type=_cpus,
        default=None,
        help="pin the load generator, the upstream and the proxies to these cores, e.g. 2-5",
    )


def common_from(
    parser: argparse.ArgumentParser, args: argparse.Namespace, supported: Sequence[str] = MODES
) -> Common:
    asked = args.modes is not None
    text = args.modes if asked else ",".join(supported)
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    others = [m for m in modes if m not in supported]
    if not modes or others:
        where = "".join(f"; {m} runs in {RUN_IN[m]} only" for m in others if m in RUN_IN)
        parser.error(f"--modes: choose from {', '.join(supported)}{where}")
    skipped: dict[str, str] = {}
    if NGINX_MODE in modes and (why := nginx_proxy.missing()) is not None:
        if asked:
            parser.error(f"--modes {NGINX_MODE}: {why}")
        skipped[NGINX_MODE] = why
        note(f"the {NGINX_MODE} mode is skipped: {why}")
        modes = tuple(m for m in modes if m != NGINX_MODE)
    return Common(
        modes=modes,
        skipped=skipped,
        smoke=args.smoke,
        plots=not args.no_plots,
        results_dir=args.results_dir,
        plots_dir=args.plots_dir,
        gateway_log_level=args.gateway_log_level,
        gateway_tracing=args.gateway_tracing,
        gateway_cpus=args.gateway_cpus,
        others_cpus=args.others_cpus,
    )


# ---------------------------------------------------------------- the processes


@attrs.define
class Stack:
    sim: Child
    sim_url: str
    sim_port: int
    abort_log: Path
    targets: dict[str, tuple[int, str]]  # mode -> (port, model name to ask for)
    children: dict[str, Child]  # "naive", "nginx", "gateway" and variants when started
    is_sim: bool  # False: bench/fast_upstream.py (no counters, no /sim endpoints)

    def pid(self, mode: str) -> int | None:
        child = self.children.get(mode)
        return None if child is None else child.process.pid


def _spawn(
    name: str,
    argv: list[str],
    log_path: Path,
    cwd: Path = ROOT,
    cpus: tuple[int, ...] | None = None,
) -> Child:
    # The repository root by default, so ``python -m bench.…`` resolves wherever the caller
    # runs from (a test, make, another directory).
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if cpus is not None:
        argv = ["taskset", "-c", ",".join(map(str, cpus)), *argv]  # execs: the pid is argv's
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd
        )
    return Child(name=name, argv=tuple(argv), log_path=log_path, process=process)


@contextlib.contextmanager
def stack(
    common: Common,
    sim: SimSettings | None,
    gateway: GatewaySettings,
    logs: Path,
    variants: Mapping[str, GatewaySettings] | None = None,
) -> Iterator[Stack]:
    """Start the simulator (``sim`` None: bench/fast_upstream.py instead), and the proxies and
    the gateways the modes need (``variants``: more modes, each another gateway), all at once
    (the gateway's imports take seconds on a busy machine); stop them all on the way out."""
    raise_nofile_limit()  # inherited by every child
    if common.others_cpus is not None:
        # This process (the load) and, inherited, the upstream and the proxies.
        os.sched_setaffinity(0, common.others_cpus)
    sim_port = free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    abort_log = logs / "sim-aborts.txt"
    abort_log.parent.mkdir(parents=True, exist_ok=True)
    abort_log.write_text("")
    children: list[tuple[Child, str]] = []
    with contextlib.ExitStack() as exits:
        tmp = Path(exits.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        try:
            if sim is None:
                sim_argv = [PYTHON, "-m", "bench.fast_upstream"]
                sim_argv += ["--listen", f"127.0.0.1:{sim_port}"]
                sim_child = _spawn("fast upstream", sim_argv, logs / "upstream.log")
            else:
                sim_argv = [PYTHON, "-m", "bench.sim_server", "--abort-log", str(abort_log)]
                sim_argv += ["--", "--listen", f"127.0.0.1:{sim_port}", *sim.flags()]
                sim_child = _spawn("simulator", sim_argv, logs / "sim.log")
            children.append((sim_child, f"{sim_url}/health"))
            targets: dict[str, tuple[int, str]] = {"direct": (sim_port, SERVED_MODEL)}
            started: dict[str, Child] = {}
            if "naive" in common.modes:
                port = free_port()
                argv = [PYTHON, "-m", "bench.naive_proxy", "--listen", f"127.0.0.1:{port}"]
                child = _spawn("naive proxy", [*argv, "--upstream", sim_url], logs / "naive.log")
                children.append((child, f"http://127.0.0.1:{port}/health"))
                targets["naive"], started["naive"] = (port, SERVED_MODEL), child
            if NGINX_MODE in common.modes:
                port = free_port()
                child = _start_nginx(exits, port, sim_port, gateway.max_inflight, logs)
                children.append((child, f"http://127.0.0.1:{port}/health"))
                targets[NGINX_MODE], started[NGINX_MODE] = (port, SERVED_MODEL), child
            sinks, tracing = otlp_sink.spawned(common.gateway_tracing, _spawn, logs)
            children += sinks
            gateways = {"gateway": gateway, **(variants or {})}
            for i, (mode, settings) in enumerate(gateways.items()):
                if mode not in common.modes:
                    continue
                port = free_port()
                folder = tmp / str(i)
                folder.mkdir()
                toml = folder / "gateway.toml"
                toml.write_text(gateway_toml(settings, port, sim_port) + tracing, encoding="utf-8")
                argv = [PYTHON, "-m", "trio_gateway", "serve", "--config", str(toml)]
                argv += ["--log-level", common.gateway_log_level]
                log_name = "gateway.log" if mode == "gateway" else f"gateway-{i}.log"
                child = _spawn(mode, argv, logs / log_name, cwd=folder, cpus=common.gateway_cpus)
                children.append((child, f"http://127.0.0.1:{port}/healthz"))
                targets[mode], started[mode] = (port, ALIAS), child
            for child, url in children:
                _wait_ready(child, url, 60.0)
            yield Stack(
                sim=sim_child,
                sim_url=sim_url,
                sim_port=sim_port,
                abort_log=abort_log,
                targets=targets,
                children=started,
                is_sim=sim is not None,
            )
        finally:
            stop_all([child for child, _ in reversed(children)])


def _start_nginx(
    exits: contextlib.ExitStack, port: int, sim_port: int, keepalive: int, logs: Path
) -> Child:
    # Its own directory, readable by all: run as root, nginx's worker runs as `nobody` and
    # must reach the temp directories (the run's other directory is root's alone).
    prefix = Path(exits.enter_context(tempfile.TemporaryDirectory(prefix="bench-nginx-")))
    prefix.chmod(0o755)
    settings = nginx_proxy.NginxSettings(
        listen_port=port,
        upstream_port=sim_port,
        keepalive=keepalive,
        prefix=prefix,
        access_log=(logs / "nginx-access.log").resolve(),
    )
    conf = prefix / "nginx.conf"
    conf.write_text(nginx_proxy.nginx_conf(settings), encoding="utf-8")
    (logs / "nginx.conf").write_text(conf.read_text(encoding="utf-8"), encoding="utf-8")
    return _spawn(NGINX_MODE, nginx_proxy.nginx_argv(conf, prefix), logs / "nginx.log")


def sim_stats(sim_url: str) -> dict[str, Any]:
    with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
        response = client.get(f"{sim_url}/sim/stats")
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
    return {k: v for k, v in stats.items() if not k.startswith("last_request")}


def sim_reset(sim_url: str) -> None:
    with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
        client.post(f"{sim_url}/sim/reset").raise_for_status()


def wait_sim_idle(sim_url: str, timeout_s: float) -> bool:
    """Until nothing runs or waits in the simulator (a proxy may still be reading an answer
    its client left: the next mode must not share the engine with it)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                stats = client.get(f"{sim_url}/sim/stats").json()
                if stats["running"] == 0 and stats["waiting"] == 0:
                    return True
            time.sleep(0.1)  # another process's state: nothing to wait on but the clock
    return False


def gateway_metrics(port: int) -> dict[str, float]:
    """The gateway's Prometheus counters, summed per name and cause/reason/code label."""
    with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
        text = client.get(f"http://127.0.0.1:{port}/metrics").text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        keep = [
            part
            for part in labels.rstrip("}").split(",")
            if part.split("=")[0] in ("cause", "reason", "code", "outcome")
        ]
        key = name + ("{" + ",".join(keep) + "}" if keep else "")
        with contextlib.suppress(ValueError):
            values[key] = values.get(key, 0.0) + float(value)
    return values


def settle(sampler: Sampler, st: Stack, mode: str, timeout_s: float) -> dict[str, int] | None:
    """Take the "after" sample once the process has closed every client connection (polled:
    nothing announces it), or at the timeout; return its TCP connections by role then."""
    pid = st.pid(mode)
    if pid is None:
        return None
    port = st.targets[mode][0]
    deadline = time.monotonic() + timeout_s
    while True:
        conns = connections(pid, port, st.sim_port)
        if conns is None or conns["clients"] == 0 or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    sampler.mark("after")
    return conns


def sampler_for(st: Stack, mode: str) -> Sampler:
    """A sampler of the process in the middle (none for ``direct``): ``mark("start")`` before
    the load, ``mark("end")`` after, ``settle`` for "after"."""
    pid = st.pid(mode)
    return Sampler({mode: pid} if pid is not None else {})


def process_summary(sampler: Sampler, mode: str) -> dict[str, Any] | None:
    return sampler.summary(mode) if mode in sampler.series else None


# ---------------------------------------------------------------- numbers and output


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def fmt(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
    return "n/a" if value is None else f"{value * scale:,.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def git_commit() -> str | None:
    """The commit checked out, read from .git without running git: another engineer works in
    this repository, and even a read-only ``git status`` may take the index lock."""
    try:
        git = ROOT / ".git"
        common = git
        if git.is_file():
            # A worktree: its HEAD in its own folder, the refs in the repository's.
            git = Path(git.read_text().strip().removeprefix("gitdir: "))
            if (git / "commondir").exists():
                common = (git / (git / "commondir").read_text().strip()).resolve()
        ref = (git / "HEAD").read_text().strip()
        if not ref.startswith("ref: "):
            return ref
        name = ref[5:]
        loose = common / name
        if loose.exists():
            return loose.read_text().strip()
        for line in (common / "packed-refs").read_text().splitlines():
            if line.endswith(" " + name):
                return line.split()[0]
    except OSError:
        return None
    return None


def machine() -> dict[str, Any]:
    from importlib.metadata import version

    import hypercorn  # noqa: F401  (its version comes from the package metadata)

    cpu_model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "trio": trio.__version__,
        "httpx": httpx.__version__,
        "hypercorn": version("hypercorn"),
        "h11": version("h11"),
        "git_commit": git_commit(),
    }


def stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def write_result(common: Common, scenario: str, when: str, payload: dict[str, Any]) -> Path:
    common.results_dir.mkdir(parents=True, exist_ok=True)
    path = common.results_dir / f"{scenario}-{when}.json"
    payload = {"scenario": scenario, "when": when, "machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    return path


def log_problems(path: Path) -> list[str]:
    """Tracebacks and errors in a process's log (the first few): a server that crashed
    quietly would otherwise look like a slow one."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    words = ("Traceback", "ERROR", "CRITICAL", "Exception")
    return [line[:300] for line in lines if any(w in line for w in words)][:20]


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def warm_up(st: Stack, mode: str, requests: int = 3) -> None:
    """A few small streamed requests through the mode's path, not measured: the first requests
    a Python server answers pay for lazy imports and first-time setup (hundreds of ms on a busy
    machine), which would otherwise land in the first mode's tail latencies."""
    port, model = st.targets[mode]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "warm up"}],
        "stream": True,
        "max_tokens": 2,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with httpx.Client(timeout=HTTP_TIMEOUT_S * 3, trust_env=False) as client:
        for _ in range(requests):
            response = client.post(f"http://127.0.0.1:{port}{CHAT_PATH}", json=body)
            if response.status_code != 200:
                raise ProcessFailed(f"warm-up through {mode}: HTTP {response.status_code}")
    if st.is_sim:
        wait_sim_idle(st.sim_url, HTTP_TIMEOUT_S)
        sim_reset(st.sim_url)
        st.abort_log.write_text("")


def run_modes(common: Common, st: Stack, run_one: Any, idle_timeout_s: float = 120.0) -> list[Any]:
    """Run ``run_one(mode)`` for each mode in order, with the simulator idle and reset before
    each, and the load average noted (the machine may be shared)."""
    rows = []
    for mode in common.modes:
        if st.is_sim:
            if not wait_sim_idle(st.sim_url, idle_timeout_s):
                raise ProcessFailed("the simulator did not go idle between modes")
            sim_reset(st.sim_url)
            st.abort_log.write_text("")
        warm_up(st, mode)
        before = loadavg()
        note(f"  {LABELS[mode]} (load average {before}) ...")
        st.sim.check_alive()
        row = run_one(mode)
        row["loadavg_before"] = before
        for child in [st.sim, *st.children.values()]:
            child.check_alive()
        rows.append(row)
    return rows


def targets_text(verdicts: Sequence[dict[str, Any]]) -> str:
    lines = []
    for v in verdicts:
        value = v["value"]
        shown = "n/a" if value is None else f"{value:,.3g}"
        state = "n/a" if v["met"] is None else ("met" if v["met"] else "MISSED")
        lines.append(f"- {v['target']}: {shown} ({state})")
    return "\n".join(lines)


def run_scenario(
    common: Common,
    *,
    scenario: str,
    label: str,
    when: str,
    sim: SimSettings | None,
    gateway: GatewaySettings,
    logs: Path,
    run_one: Any,
    targets: Any,
    table: Any,
    config: Any,
    extra: dict[str, Any] | None = None,
    variants: Mapping[str, GatewaySettings] | None = None,
) -> list[Any]:
    """One scenario's modes on one stack, then its JSON result, table and verdicts: the
    part every scenario shares. ``run_one(stack, mode)`` gives a mode's row; ``targets(rows)``
    its verdicts; ``table(rows)`` the markdown printed."""
    load_before = loadavg()
    note(f"scenario {label} ({scenario}): load average {load_before}")
    started = time.monotonic()
    with stack(common, sim, gateway, logs, variants) as st:
        rows = run_modes(common, st, lambda mode: run_one(st, mode))
    wall_s = time.monotonic() - started
    verdicts = targets(rows)
    path = write_result(
        common,
        scenario,
        when,
        {
            "config": attrs.asdict(config),
            "sim": attrs.asdict(sim) if sim is not None else None,
            "gateway": attrs.asdict(gateway),
            "variants": {mode: attrs.asdict(s) for mode, s in (variants or {}).items()},
            "skipped_modes": dict(common.skipped),
            "cpus": {"gateways": common.gateway_cpus, "others": common.others_cpus},
            **(extra or {}),
            "loadavg_before": load_before,
            "wall_s": wall_s,
            "rows": rows,
            "targets": verdicts,
            "log_problems": {p.name: log_problems(p) for p in logs.glob("*.log")},
        },
    )
    print(table(rows))
    print(targets_text(verdicts))
    note(f"results: {path} ({wall_s:.0f} s)")
    return rows
