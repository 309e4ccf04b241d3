"""Scenario F, fleet routing: which replica each turn of a conversation goes to, and what that
does to vLLM's prefix cache, time to first token and load spread (issue 13, item 6).

Four simulated vLLM replicas (``python -m trio_gateway.sim``, one process each, on free ports),
each with a bounded prefix cache and a prefill cost that makes a cache miss visible in the time
to first token, behind one trio-gateway whose one provider lists the four as ``endpoints``. The
same multi-turn agent workload (``bench/fleet_load.py``) runs once per routing policy
(``round_robin``, ``least_loaded``, ``affinity``), each on fresh simulators so that every cache
starts empty, plus:

- ``ideal``: one simulator with an unbounded prefix cache and a batch that holds every session:
  the hit rate no routing among replicas can beat;
- ``affinity_opening``: affinity without the ``x-session-id`` header (the key is then the
  conversation's opening, docs/routing.md);
- ``affinity_kill``: affinity again, with one simulator killed (SIGKILL) at 40 % of the turns
  and restarted on the same port at 70 %;
- ``affinity_eps<E>``: affinity with another ``affinity_epsilon`` (``--epsilons``).

Reported per run: the prefix-cache hit rate (tokens: the sum over replicas of Δhits / Δqueries
read from each simulator's ``/metrics``; the same from the gateway's
``gateway_prefix_cache_*_tokens_total``, and the clients' sum of ``cached_tokens`` over
``prompt_tokens``), TTFT p50/p99 at the client, prompt tokens prefilled (Δqueries - Δhits),
and the load spread: each replica's ``/load`` sampled every 50 ms, averaged over the run;
max/mean of those averages, and the peak.

Targets (issue 13): affinity's hit rate ≥ 90 % of the ideal's, with max/mean load ≤ 1.25, and a
lower TTFT p50 than round robin. The kill: no turn lost, errors only where a stream was cut.

    .venv/bin/python -m bench.fleet
    .venv/bin/python -m bench.fleet --smoke --no-plots
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from bench import harness
from bench.fleet_load import (
    LoadSeries,
    Progress,
    Turn,
    Workload,
    prometheus_samples,
    replica_states,
    run_sessions,
    sample_loads,
    system_prompt,
)
from bench.harness import ALIAS, SERVED_MODEL, Common, _spawn, fmt
from bench.processes import PYTHON, Child, ProcessFailed, _stop, _wait_ready, quiet_ports
from bench.procstat import loadavg
from trio_gateway.providers.openai_compatible.signals import parse_vllm_metrics
from trio_gateway.sim.text import count_prompt

SCENARIO = "fleet"
PROVIDER = "fleet"
IDEAL_CACHE_BLOCKS = 10_000_000  # never evicts anything this workload asks for
POLICIES = ("round_robin", "least_loaded", "affinity")
DEFAULT_RUNS = ("ideal", *POLICIES, "affinity_opening", "affinity_kill")


@attrs.frozen(kw_only=True)
class Config:
    replicas: int
    sessions: int
    turns: int
    concurrency: int
    system_tokens: int  # the shared system prompt's size, in the simulator's tokens
    answer_tokens: tuple[int, int]  # each answer's length, drawn per turn (max_tokens)
    think_s: float  # a tool's run between two turns, drawn per turn from [0, this)
    output_lines: int  # tool output lines in each later user message (~21 tokens a line)
    prefix_cache_blocks: int  # per replica, 16 tokens each
    prefill_s_per_token: float
    decode_step_s: float
    decode_step_s_per_seq: float
    max_num_seqs: int  # per replica
    max_inflight: int  # per replica: the gateway's gate
    epsilon: float
    epsilons: tuple[float, ...]  # more affinity runs, one per value
    runs: tuple[str, ...]
    kill_at: float  # fraction of all turns done
    restart_at: float
    kill_replica: int
    probe_interval_s: float
    scrape_interval_s: float
    sample_interval_s: float
    state_interval_s: float
    turn_attempts: int
    deadline_s: float
    connect_timeout_s: float = 30.0
    max_model_len: int = 8192


@attrs.frozen(kw_only=True)
class RunSpec:
    name: str
    routing: str  # the gateway's policy; "ideal" runs round_robin over a single replica
    epsilon: float
    replicas: int
    cache_blocks: int
    max_num_seqs: int
    max_inflight: int
    session_header: bool
    kill: bool


def run_specs(cfg: Config) -> list[RunSpec]:
    base = RunSpec(
        name="",
        routing="",
        epsilon=cfg.epsilon,
        replicas=cfg.replicas,
        cache_blocks=cfg.prefix_cache_blocks,
        max_num_seqs=cfg.max_num_seqs,
        max_inflight=cfg.max_inflight,
        session_header=True,
        kill=False,
    )
    names = list(cfg.runs) + [f"affinity_eps{e:g}" for e in cfg.epsilons]
    specs = []
    for name in names:
        if name == "ideal":
            # One engine with room for every session at once and a cache that never evicts.
            slots = max(cfg.concurrency, cfg.max_num_seqs) + 8
            specs.append(
                attrs.evolve(
                    base,
                    name=name,
                    routing="round_robin",
                    replicas=1,
                    cache_blocks=IDEAL_CACHE_BLOCKS,
                    max_num_seqs=slots,
                    max_inflight=slots,
                )
            )
        elif name in POLICIES:
            specs.append(attrs.evolve(base, name=name, routing=name))
        elif name == "affinity_opening":
            specs.append(attrs.evolve(base, name=name, routing="affinity", session_header=False))
        elif name == "affinity_kill":
            specs.append(attrs.evolve(base, name=name, routing="affinity", kill=True))
        elif name.startswith("affinity_eps"):
            epsilon = float(name.removeprefix("affinity_eps"))
            specs.append(attrs.evolve(base, name=name, routing="affinity", epsilon=epsilon))
        else:
            raise ValueError(f"unknown run {name!r}")
    return specs


def label(spec: RunSpec) -> str:
    if spec.name == "ideal":
        return "ideal (1 replica, unbounded cache)"
    if spec.name == "affinity_opening":
        return "affinity, no header (opening key)"
    if spec.name == "affinity_kill":
        return "affinity, replica killed + restarted"
    if spec.name.startswith("affinity_eps"):
        return f"affinity ε={spec.epsilon:g}"
    if spec.routing == "affinity":
        return f"affinity (ε={spec.epsilon:g})"
    return spec.routing


# ---------------------------------------------------------------- the processes


def sim_flags(cfg: Config, spec: RunSpec) -> list[str]:
    return [
        "--served-model-name",
        SERVED_MODEL,
        "--max-num-seqs",
        str(spec.max_num_seqs),
        "--max-model-len",
        str(cfg.max_model_len),
        "--decode-step-s",
        repr(cfg.decode_step_s),
        "--decode-step-s-per-seq",
        repr(cfg.decode_step_s_per_seq),
        "--prefill-s-per-token",
        repr(cfg.prefill_s_per_token),
        "--prefix-cache-blocks",
        str(spec.cache_blocks),
        "--enable-prompt-tokens-details",
    ]


def gateway_toml(cfg: Config, spec: RunSpec, port: int, sim_ports: Sequence[int]) -> str:
    endpoints = ", ".join(f'"http://127.0.0.1:{p}/v1"' for p in sim_ports)
    epsilon = f"affinity_epsilon = {spec.epsilon!r}\n" if spec.routing == "affinity" else ""
    # Probes on, at a short interval: they take a replica that stops answering out of rotation
    # (the kill) and bring it back, and they start the scrapes of /metrics and /load that feed
    # least_loaded and the gateway's prefix-cache metrics. A probe is a 16-token prompt with no
    # full block: it adds queries, never hits, to the simulators' counters.
    return f"""# Generated by bench/fleet.py
[server]
listen = "127.0.0.1:{port}"
drain_timeout_s = 2.0

[aliases.{ALIAS}]
[[aliases.{ALIAS}.providers]]
name = "{PROVIDER}"
type = "openai_compatible"
endpoints = [{endpoints}]
routing = "{spec.routing}"
{epsilon}model = "{SERVED_MODEL}"
max_inflight = {spec.max_inflight}
queue_timeout_s = 60.0
probe = true
probe_interval_s = {cfg.probe_interval_s!r}
probe_timeout_s = 5.0
scrape_interval_s = {cfg.scrape_interval_s!r}
"""


@attrs.define
class Fleet:
    """The simulators and the gateway of one run."""

    sims: list[Child]
    sim_ports: list[int]
    sim_argvs: list[list[str]]
    gateway: Child
    port: int
    logs: Path
    restarts: int = 0

    def sim_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.sim_ports[i]}"

    def replica(self, i: int) -> str:
        return f"127.0.0.1:{self.sim_ports[i]}"

    def kill(self, i: int) -> None:
        """SIGKILL: a crash, not a drain; streams in flight on it are cut."""
        process = self.sims[i].process
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def restart(self, i: int) -> None:
        """The same simulator on the same port, with an empty cache, as a restarted vLLM."""
        self.restarts += 1
        child = _spawn(
            f"simulator {i} (restarted)",
            self.sim_argvs[i],
            self.logs / f"sim-{i}-restart-{self.restarts}.log",
        )
        self.sims[i] = child
        wait_listening(child, f"127.0.0.1:{self.sim_ports[i]}/v1", 60.0)
        _wait_ready(child, f"{self.sim_url(i)}/health", 60.0)


def wait_listening(child: Child, marker: str, timeout_s: float) -> None:
    """Until the child's own log says it listens on its port (``marker``): an answer on the
    port alone could come from another process."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        child.check_alive()
        with contextlib.suppress(OSError):
            if marker in child.log_path.read_text(encoding="utf-8", errors="replace"):
                return
        time.sleep(0.05)  # another process's output: nothing to wait on but the clock
    raise ProcessFailed(f"{child.name} did not log {marker!r} within {timeout_s:g} s")


@contextlib.contextmanager
def fleet(common: Common, cfg: Config, spec: RunSpec, logs: Path) -> Iterator[Fleet]:
    """Start the simulators and the gateway at once (the gateway's imports take seconds on a
    busy machine; its first probes may fail meanwhile, which its start-up grace ignores), wait
    until every replica is healthy in the gateway's eyes, stop them all on the way out."""
    sims: list[Child] = []
    gateway: Child | None = None
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        try:
            ports = quiet_ports(spec.replicas + 1)
            port = ports.pop()
            argvs = []
            for i, sim_port in enumerate(ports):
                argv = [PYTHON, "-m", "trio_gateway.sim", "--listen", f"127.0.0.1:{sim_port}"]
                argvs.append([*argv, *sim_flags(cfg, spec)])
                sims.append(_spawn(f"simulator {i}", argvs[-1], logs / f"sim-{i}.log"))
            toml = Path(tmp) / "gateway.toml"
            toml.write_text(gateway_toml(cfg, spec, port, ports), encoding="utf-8")
            argv = [PYTHON, "-m", "trio_gateway", "serve", "--config", str(toml)]
            argv += ["--log-level", common.gateway_log_level]
            gateway = _spawn("gateway", argv, logs / "gateway.log", cwd=Path(tmp))
            for i, sim in enumerate(sims):
                wait_listening(sim, f"127.0.0.1:{ports[i]}/v1", 60.0)
                _wait_ready(sim, f"http://127.0.0.1:{ports[i]}/health", 60.0)
            if common.gateway_log_level in ("debug", "info"):  # the line is at info
                wait_listening(gateway, f"serving on http://127.0.0.1:{port}", 60.0)
            _wait_ready(gateway, f"http://127.0.0.1:{port}/healthz", 60.0)
            handle = Fleet(
                sims=sims, sim_ports=ports, sim_argvs=argvs, gateway=gateway, port=port, logs=logs
            )
            wait_healthy(handle, 60.0)
            yield handle
        finally:
            if gateway is not None:
                _stop(gateway)
            for sim in sims:
                _stop(sim)


def gateway_metrics_text(port: int) -> str:
    with httpx.Client(timeout=harness.HTTP_TIMEOUT_S, trust_env=False) as client:
        return client.get(f"http://127.0.0.1:{port}/metrics").text


def wait_healthy(fl: Fleet, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    wanted = {fl.replica(i) for i in range(len(fl.sims))}
    while time.monotonic() < deadline:
        fl.gateway.check_alive()
        with contextlib.suppress(httpx.HTTPError):
            states = replica_states(gateway_metrics_text(fl.port))
            if all(states.get(r) == "healthy" for r in wanted):
                return
        time.sleep(0.1)  # another process's state: nothing to wait on but the clock
    raise ProcessFailed(f"the gateway did not see every replica healthy in {timeout_s:g} s")


def sim_counters(url: str) -> tuple[float, float]:
    """The simulator's prefix-cache (queries, hits), in tokens, from its /metrics."""
    with httpx.Client(timeout=harness.HTTP_TIMEOUT_S, trust_env=False) as client:
        signals = parse_vllm_metrics(client.get(f"{url}/metrics").text)
    return signals.prefix_cache_queries or 0.0, signals.prefix_cache_hits or 0.0


def gateway_prefix(port: int) -> dict[str, dict[str, float]]:
    """Per replica, the gateway's prefix-cache counters and ratio (since it first read it)."""
    out: dict[str, dict[str, float]] = {}
    names = {
        "gateway_prefix_cache_queries_tokens_total": "queries",
        "gateway_prefix_cache_hits_tokens_total": "hits",
        "gateway_prefix_cache_hit_ratio": "ratio",
    }
    for name, labels, value in prometheus_samples(gateway_metrics_text(port)):
        if name in names and labels.get("provider") == PROVIDER:
            out.setdefault(labels["replica"], {})[names[name]] = value
    return out


def wait_scrape(fl: Fleet, timeout_s: float) -> bool:
    """Until the gateway has scraped the simulators again (its prefix-cache query count moves:
    the probes alone add queries between two scrapes), so that what it shows covers
    everything before this call."""
    deadline = time.monotonic() + timeout_s

    def total() -> float:
        return sum(r.get("queries", 0.0) for r in gateway_prefix(fl.port).values())

    first = total()
    while time.monotonic() < deadline:
        time.sleep(0.1)  # another process's state: nothing to wait on but the clock
        if total() != first:
            return True
    return False


def wait_idle(fl: Fleet, timeout_s: float, skip: frozenset[int] = frozenset()) -> bool:
    """Until no simulator (but those in ``skip``: down) holds a sequence (its /load is 0)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=harness.HTTP_TIMEOUT_S, trust_env=False) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                loads = [
                    client.get(f"{fl.sim_url(i)}/load").json()["server_load"]
                    for i in range(len(fl.sims))
                    if i not in skip
                ]
                if not any(loads):
                    return True
            time.sleep(0.1)  # another process's state: nothing to wait on but the clock
    return False


def warm_up(fl: Fleet) -> None:
    """A few requests through the gateway, not measured: the first requests a Python server
    answers pay for lazy imports. Distinct short prompts, so they leave the caches as good as
    empty (the shared system prompt is not sent)."""
    with httpx.Client(timeout=harness.HTTP_TIMEOUT_S * 3, trust_env=False) as client:
        for i in range(2 * len(fl.sims)):
            body = {
                "model": ALIAS,
                "messages": [{"role": "user", "content": f"warm up {i}"}],
                "stream": True,
                "max_tokens": 2,
                "chat_template_kwargs": {"enable_thinking": False},
            }
            response = client.post(
                f"http://127.0.0.1:{fl.port}{harness.CHAT_PATH}",
                json=body,
                headers={"x-session-id": f"warm-up-{i}"},
            )
            if response.status_code != 200:
                raise ProcessFailed(f"warm-up through the gateway: HTTP {response.status_code}")


# ---------------------------------------------------------------- the kill and restart


@attrs.define
class Chaos:
    replica: int
    kill_t_s: float | None = None
    restart_t_s: float | None = None  # the new process spawned
    ready_t_s: float | None = None  # it answers /health
    counters_at_kill: tuple[float, float] | None = None  # its (queries, hits) just before
    out_of_rotation_t_s: float | None = None  # the gateway first shows it unhealthy
    back_in_rotation_t_s: float | None = None  # healthy again after the restart
    skipped: str | None = None


async def chaos(fl: Fleet, cfg: Config, progress: Progress, t0: float, out: Chaos) -> None:
    """Kill one simulator at ``kill_at`` of the turns, restart it at ``restart_at``."""
    for fraction, what in ((cfg.kill_at, "kill"), (cfg.restart_at, "restart")):
        reached = progress.at(fraction)
        async with trio.open_nursery() as race:
            # Whichever comes first: the milestone, or the end of the sessions (a smoke run's
            # load may end while a restart takes its seconds).
            async def first(event: trio.Event, scope: trio.CancelScope) -> None:
                await event.wait()
                scope.cancel()

            race.start_soon(first, reached, race.cancel_scope)
            race.start_soon(first, progress.finished, race.cancel_scope)
        if not reached.is_set():
            out.skipped = f"the sessions ended before the {what}"
            return
        if what == "kill":
            # Its counters die with it: read them first (a request admitted in the
            # milliseconds between is not counted here).
            url = fl.sim_url(out.replica)
            out.counters_at_kill = await trio.to_thread.run_sync(sim_counters, url)
            out.kill_t_s = time.monotonic() - t0
            await trio.to_thread.run_sync(fl.kill, out.replica)
            out.out_of_rotation_t_s = await until_state(fl, cfg, out.replica, "unhealthy", t0)
        else:
            out.restart_t_s = time.monotonic() - t0
            await trio.to_thread.run_sync(fl.restart, out.replica)
            out.ready_t_s = time.monotonic() - t0
            out.back_in_rotation_t_s = await until_state(fl, cfg, out.replica, "healthy", t0)


async def until_state(fl: Fleet, cfg: Config, i: int, state: str, t0: float) -> float | None:
    """When the gateway's /metrics first shows replica ``i`` in ``state`` (polled: the
    gateway announces nothing), or None after 30 s."""
    replica = fl.replica(i)
    async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
        with trio.move_on_after(30.0):
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.get(f"http://127.0.0.1:{fl.port}/metrics")
                    if replica_states(response.text).get(replica) == state:
                        return time.monotonic() - t0
                await trio.sleep(cfg.state_interval_s)
    return None


# ---------------------------------------------------------------- one run


def hit_rate(queries: float, hits: float) -> float | None:
    return hits / queries if queries > 0 else None


def load_spread(series: LoadSeries, end_s: float) -> dict[str, Any]:
    """Each replica's time-averaged ``/load`` over the sessions (samples are evenly spaced; a
    replica that did not answer counts 0), max/mean of those averages, and the peak."""
    rows = [row for t, row in zip(series.t_s, series.loads, strict=True) if t <= end_s]
    if not rows:
        return {"per_replica_mean": [], "max_over_mean": None, "peak": None, "samples": 0}
    n = len(rows[0])
    means = [sum(row[i] or 0 for row in rows) / len(rows) for i in range(n)]
    overall = sum(means) / n
    peak = max((v for row in rows for v in row if v is not None), default=None)
    return {
        "per_replica_mean": means,
        "max_over_mean": max(means) / overall if overall > 0 else None,
        "peak": peak,
        "peak_over_mean": peak / overall if peak is not None and overall > 0 else None,
        "samples": len(rows),
    }


def by_turn(turns: Sequence[Turn], count: int) -> list[float | None]:
    """The clients' hit rate (cached / prompt tokens) per turn index."""
    out: list[float | None] = []
    for index in range(count):
        ok = [t for t in turns if t.turn == index and t.error is None and t.prompt_tokens]
        prompt = sum(t.prompt_tokens or 0 for t in ok)
        cached = sum(t.cached_tokens or 0 for t in ok)
        out.append(cached / prompt if prompt else None)
    return out


def client_rate(turns: Sequence[Turn]) -> float | None:
    ok = [t for t in turns if t.error is None and t.prompt_tokens]
    prompt = sum(t.prompt_tokens or 0 for t in ok)
    return sum(t.cached_tokens or 0 for t in ok) / prompt if prompt else None


def kill_report(chaos_: Chaos, turns: Sequence[Turn], replica: str, end_s: float) -> dict[str, Any]:
    """What the kill and the restart did: the client-visible errors and where they fall, the
    hit rate in each window (before, down, back with a cold cache, after)."""
    kill, ready, back_t = chaos_.kill_t_s, chaos_.ready_t_s, chaos_.back_in_rotation_t_s
    failed = [t for t in turns if t.error is not None]

    def where(t: Turn) -> str:
        if kill is None:
            return "no kill"
        if t.started_s < kill <= (t.end_s or 0.0):
            return "in flight at the kill"
        if t.started_s >= kill and (ready is None or t.started_s < ready):
            return "started while it was down"
        return "elsewhere"

    windows: list[tuple[str, float, float]] = []
    if kill is not None:
        windows.append(("before the kill", 0.0, kill))
        down_end = back_t or ready or end_s
        windows.append(("killed, until back in rotation", kill, down_end))
        if back_t is not None:
            cold_end = min(back_t + 5.0, end_s + 1.0)
            windows.append(("back in rotation (cold cache), next 5 s", back_t, cold_end))
            if cold_end < end_s:
                windows.append(("then to the end", cold_end, end_s + 1.0))
    rates = []
    for name, start, stop in windows:
        inside = [t for t in turns if start <= t.started_s < stop]
        rates.append(
            {
                "window": name,
                "from_s": start,
                "to_s": stop,
                "turns": sum(1 for t in inside if t.error is None),
                "errors": sum(1 for t in inside if t.error is not None),
                "client_hit_rate": client_rate(inside),
            }
        )
    return {
        **attrs.asdict(chaos_),
        "replica_name": replica,
        "errors": len(failed),
        "errors_by_kind": dict(Counter(t.error for t in failed if t.error)),
        "errors_by_when": dict(Counter(where(t) for t in failed)),
        "error_examples": [
            {"kind": t.error, "detail": t.detail, "started_s": t.started_s, "end_s": t.end_s}
            for t in failed[:5]
        ],
        "windows": rates,
    }


def run_one(common: Common, cfg: Config, spec: RunSpec, system: str, logs: Path) -> dict[str, Any]:
    harness.note(f"  {label(spec)}: starting {spec.replicas} simulator(s) and the gateway")
    with fleet(common, cfg, spec, logs) as fl:
        warm_up(fl)
        wait_idle(fl, 30.0)
        # The gateway's counters lag the simulators' by up to a scrape: wait for one.
        wait_scrape(fl, cfg.scrape_interval_s * 2 + 5.0)
        before_sims = [sim_counters(fl.sim_url(i)) for i in range(spec.replicas)]
        before_gw = gateway_prefix(fl.port)
        before = loadavg()
        harness.note(f"  {label(spec)}: load average {before}, running the sessions")
        work = Workload(
            sessions=cfg.sessions,
            turns=cfg.turns,
            concurrency=cfg.concurrency,
            system=system,
            answer_tokens=cfg.answer_tokens,
            think_s=cfg.think_s,
            stagger_s=1.0 / cfg.concurrency,
            send_session_header=spec.session_header,
            output_lines=cfg.output_lines,
            turn_attempts=cfg.turn_attempts,
            connect_timeout_s=cfg.connect_timeout_s,
            deadline_s=cfg.deadline_s,
        )
        loads = LoadSeries()
        chaos_ = Chaos(replica=cfg.kill_replica % spec.replicas)
        urls = [fl.sim_url(i) for i in range(spec.replicas)]

        async def load() -> Any:
            t0 = time.monotonic()
            progress = Progress(cfg.sessions * cfg.turns)
            background = [lambda: sample_loads(urls, cfg.sample_interval_s, t0, loads)]
            alongside = []
            if spec.kill:
                alongside.append(lambda: chaos(fl, cfg, progress, t0, chaos_))
            return await run_sessions(fl.port, ALIAS, work, t0, progress, background, alongside)

        result = trio.run(load)
        # A replica killed and never restarted (the sessions ended first) counts nothing more.
        down = frozenset(
            {chaos_.replica} if chaos_.kill_t_s is not None and chaos_.ready_t_s is None else ()
        )
        idle = wait_idle(fl, 60.0, down)
        scraped = wait_scrape(fl, cfg.scrape_interval_s * 2 + 5.0)
        after_sims = [
            (0.0, 0.0) if i in down else sim_counters(fl.sim_url(i)) for i in range(spec.replicas)
        ]
        after_gw = gateway_prefix(fl.port)
        for i, child in enumerate([*fl.sims, fl.gateway]):
            if i not in down:
                child.check_alive()
        replicas = [fl.replica(i) for i in range(spec.replicas)]
    # Per replica: Δ over the run from the simulator's counters; a killed replica's are the
    # old process's up to the kill plus the new one's from zero.
    per_replica: list[dict[str, Any]] = []
    for i, name in enumerate(replicas):
        (q0, h0), (q1, h1) = before_sims[i], after_sims[i]
        if spec.kill and i == chaos_.replica and chaos_.counters_at_kill is not None:
            qk, hk = chaos_.counters_at_kill
            dq, dh = (qk - q0) + q1, (hk - h0) + h1
        else:
            dq, dh = q1 - q0, h1 - h0
        gw0, gw1 = before_gw.get(name, {}), after_gw.get(name, {})
        gq = gw1.get("queries", 0.0) - gw0.get("queries", 0.0)
        gh = gw1.get("hits", 0.0) - gw0.get("hits", 0.0)
        per_replica.append(
            {
                "replica": name,
                "sim_queries": dq,
                "sim_hits": dh,
                "sim_hit_rate": hit_rate(dq, dh),
                "sim_hit_rate_since_start": hit_rate(q1, h1),
                "gateway_queries": gq,
                "gateway_hits": gh,
                "gateway_hit_rate": hit_rate(gq, gh),
                "gateway_hit_ratio_gauge": gw1.get("ratio"),
            }
        )
    queries = sum(r["sim_queries"] for r in per_replica)
    hits = sum(r["sim_hits"] for r in per_replica)
    gw_queries = sum(r["gateway_queries"] for r in per_replica)
    gw_hits = sum(r["gateway_hits"] for r in per_replica)
    turns = result.turns
    ok = [t for t in turns if t.error is None]
    ttfts = [t.ttft_s for t in ok if t.ttft_s is not None]
    failures = Counter(t.error for t in turns if t.error is not None)
    row: dict[str, Any] = {
        "run": spec.name,
        "label": label(spec),
        "spec": attrs.asdict(spec),
        "loadavg_before": before,
        "wall_s": result.wall_s,
        "timed_out": result.timed_out,
        "idle_after": idle,
        "gateway_scraped_after": scraped,
        "turns_total": cfg.sessions * cfg.turns,
        "turns_completed": len(ok),
        "attempts": len(turns),
        "sessions_given_up": result.sessions_given_up,
        "failures": dict(failures),
        "turns_per_s": len(ok) / result.wall_s if result.wall_s > 0 else None,
        "hit_rate": hit_rate(queries, hits),
        "hit_rate_gateway": hit_rate(gw_queries, gw_hits),
        "hit_rate_client": client_rate(turns),
        "prompt_tokens_queried": queries,
        "prompt_tokens_hit": hits,
        "prompt_tokens_prefilled": queries - hits,
        "gateway_queries": gw_queries,
        "gateway_hits": gw_hits,
        "client_prompt_tokens": sum(t.prompt_tokens or 0 for t in ok),
        "client_cached_tokens": sum(t.cached_tokens or 0 for t in ok),
        "per_replica": per_replica,
        "ttft_p50_s": harness.percentile(ttfts, 0.5),
        "ttft_p99_s": harness.percentile(ttfts, 0.99),
        "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None,
        "hit_rate_by_turn": by_turn(turns, cfg.turns),
        "load": load_spread(loads, result.wall_s),
        "load_series": {"t_s": loads.t_s, "loads": loads.loads, "replicas": replicas},
        "ttfts_s": ttfts,
    }
    if spec.kill:
        row["kill"] = kill_report(chaos_, turns, replicas[chaos_.replica], result.wall_s)
    harness.note(
        f"  {label(spec)}: {len(ok)}/{cfg.sessions * cfg.turns} turns in {result.wall_s:.1f} s, "
        f"hit rate {fmt(row['hit_rate'], 3)}, TTFT p50 {fmt(row['ttft_p50_s'], 0, 1000)} ms, "
        f"max/mean load {fmt(row['load']['max_over_mean'], 2)}"
    )
    return row


# ---------------------------------------------------------------- the workload's sizes


def workload_sizes(cfg: Config, system: str) -> dict[str, Any]:
    """Tokens and 16-token blocks of the workload (answers stood in for by as many words):
    what the prefix caches have to hold."""

    def tokens(messages: list[dict[str, str]]) -> int:
        return count_prompt(messages, None, thinking=False).tokens

    from bench.fleet_load import first_message, next_message

    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": first_message(7)},
    ]
    system_only = tokens([{"role": "system", "content": system}])
    prompts = [tokens(messages)]
    for turn in range(1, cfg.turns):
        answer = " ".join(["word"] * (sum(cfg.answer_tokens) // 2))
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": next_message(7, turn, cfg.output_lines)},
        ]
        prompts.append(tokens(messages))
    shared_blocks = system_only // 16
    own_last = math.ceil((prompts[-1] - system_only) / 16) + 1
    return {
        "system_prompt_tokens": system_only,
        "prompt_tokens_by_turn": prompts,
        "shared_blocks": shared_blocks,
        "session_own_blocks_at_last_turn": own_last,
        "live_blocks_at_most": shared_blocks + cfg.concurrency * own_last,
        "live_blocks_per_replica_affinity": shared_blocks
        + math.ceil(cfg.concurrency / cfg.replicas) * own_last,
        "all_sessions_blocks": shared_blocks + cfg.sessions * own_last,
        "prefix_cache_blocks_per_replica": cfg.prefix_cache_blocks,
    }


# ---------------------------------------------------------------- results


def table(rows: list[dict[str, Any]]) -> str:
    header = ["run", "hit rate (sims / gateway / clients)", "TTFT p50 / p99 (ms)"]
    header += ["prompt tokens prefilled", "max/mean load", "peak in flight", "turns", "errors"]
    header += ["wall (s)", "load avg"]
    out = []
    for r in rows:
        rates = " / ".join(
            fmt(r[k], 1, 100) + "%" if r[k] is not None else "n/a"
            for k in ("hit_rate", "hit_rate_gateway", "hit_rate_client")
        )
        out.append(
            [
                r["label"],
                rates,
                f"{fmt(r['ttft_p50_s'], 0, 1000)} / {fmt(r['ttft_p99_s'], 0, 1000)}",
                f"{r['prompt_tokens_prefilled']:,.0f}",
                fmt(r["load"]["max_over_mean"], 2),
                str(r["load"]["peak"]),
                f"{r['turns_completed']}/{r['turns_total']}",
                ", ".join(f"{k} {v}" for k, v in sorted(r["failures"].items())) or "0",
                fmt(r["wall_s"], 0),
                fmt((r["loadavg_before"] or [None])[0], 2),
            ]
        )
    return harness.markdown_table(header, out)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {r["run"]: r for r in rows}
    out: list[dict[str, Any]] = []
    aff, ideal, rr = by.get("affinity"), by.get("ideal"), by.get("round_robin")
    if aff is not None and ideal is not None:
        share = (
            aff["hit_rate"] / ideal["hit_rate"]
            if aff["hit_rate"] is not None and ideal["hit_rate"]
            else None
        )
        out.append(
            {
                "target": "affinity hit rate ≥ 90 % of the ideal single replica's (share)",
                "value": share,
                "met": share is not None and share >= 0.9,
            }
        )
    if aff is not None:
        spread = aff["load"]["max_over_mean"]
        out.append(
            {
                "target": "affinity max/mean of per-replica time-averaged in-flight ≤ 1.25",
                "value": spread,
                "met": spread is not None and spread <= 1.25,
            }
        )
    if aff is not None and rr is not None:
        a, r = aff["ttft_p50_s"], rr["ttft_p50_s"]
        out.append(
            {
                "target": "affinity TTFT p50 < round_robin's (ms saved)",
                "value": None if a is None or r is None else (r - a) * 1000,
                "met": a is not None and r is not None and a < r,
            }
        )
    kill = by.get("affinity_kill")
    if kill is not None:
        lost = kill["turns_total"] - kill["turns_completed"]
        out.append(
            {
                "target": "kill + restart: every turn completes (turns lost)",
                "value": lost,
                "met": lost == 0,
            }
        )
        report = kill.get("kill", {})
        later = sum(
            n
            for when, n in report.get("errors_by_when", {}).items()
            if when != "in flight at the kill"
        )
        out.append(
            {
                "target": "kill + restart: no client-visible error except streams cut by the kill",
                "value": later,
                "met": later == 0,
            }
        )
    return out


# ---------------------------------------------------------------- command line


def parse(argv: Sequence[str]) -> tuple[Common, Config]:
    p = argparse.ArgumentParser(
        prog="python -m bench.fleet",
        description="Scenario F: replica routing policies on multi-turn agent sessions.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs")
    p.add_argument("--no-plots", action="store_true", help="no PNGs (and no matplotlib needed)")
    p.add_argument("--results-dir", type=Path, default=harness.RESULTS_DIR)
    p.add_argument("--plots-dir", type=Path, default=harness.PLOTS_DIR)
    p.add_argument("--gateway-log-level", default="info")
    p.add_argument("--runs", default=",".join(DEFAULT_RUNS), help="comma-separated")
    p.add_argument("--epsilons", default="", help="extra affinity runs, e.g. 0.1,0.5")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=50, help="sessions at once")
    p.add_argument("--system-tokens", type=int, default=1200)
    p.add_argument("--answer-min-tokens", type=int, default=16)
    p.add_argument("--answer-max-tokens", type=int, default=40)
    p.add_argument("--think-s", type=float, default=0.3, help="tool time between turns, at most")
    p.add_argument("--output-lines", type=int, default=6, help="tool output per later turn")
    p.add_argument("--prefix-cache-blocks", type=int, default=2048, help="per replica")
    p.add_argument("--prefill-s-per-token", type=float, default=0.00006)
    p.add_argument("--decode-step-s", type=float, default=0.015)
    p.add_argument("--decode-step-s-per-seq", type=float, default=0.0004)
    p.add_argument("--max-num-seqs", type=int, default=32, help="per replica")
    p.add_argument("--max-inflight", type=int, default=32, help="per replica")
    p.add_argument("--epsilon", type=float, default=0.25, help="affinity_epsilon")
    p.add_argument("--kill-at", type=float, default=0.4, help="fraction of the turns")
    p.add_argument("--restart-at", type=float, default=0.7, help="fraction of the turns")
    p.add_argument("--probe-interval-s", type=float, default=0.5)
    p.add_argument("--scrape-interval-s", type=float, default=5.0, help="the gateway's default")
    p.add_argument("--sample-interval-s", type=float, default=0.05)
    p.add_argument("--deadline-s", type=float, default=300.0, help="per run")
    a = p.parse_args(argv)
    common = Common(
        modes=("gateway",),
        smoke=a.smoke,
        plots=not a.no_plots,
        results_dir=a.results_dir,
        plots_dir=a.plots_dir,
        gateway_log_level=a.gateway_log_level,
    )
    runs = tuple(r.strip() for r in a.runs.split(",") if r.strip())
    epsilons = tuple(float(e) for e in a.epsilons.split(",") if e.strip())
    cfg = Config(
        replicas=a.replicas,
        sessions=a.sessions,
        turns=a.turns,
        concurrency=a.concurrency,
        system_tokens=a.system_tokens,
        answer_tokens=(a.answer_min_tokens, a.answer_max_tokens),
        think_s=a.think_s,
        output_lines=a.output_lines,
        prefix_cache_blocks=a.prefix_cache_blocks,
        prefill_s_per_token=a.prefill_s_per_token,
        decode_step_s=a.decode_step_s,
        decode_step_s_per_seq=a.decode_step_s_per_seq,
        max_num_seqs=a.max_num_seqs,
        max_inflight=a.max_inflight,
        epsilon=a.epsilon,
        epsilons=epsilons,
        runs=runs,
        kill_at=a.kill_at,
        restart_at=a.restart_at,
        kill_replica=1,
        probe_interval_s=a.probe_interval_s,
        scrape_interval_s=a.scrape_interval_s,
        sample_interval_s=a.sample_interval_s,
        state_interval_s=0.25,
        turn_attempts=3,
        deadline_s=a.deadline_s,
    )
    if common.smoke:
        # Two sessions at once on two replicas: affinity's bound (ceil(1.25 x 2 / 2) = 2) never
        # turns a session away from its replica, whatever the hash does.
        cfg = attrs.evolve(
            cfg,
            replicas=2,
            sessions=6,
            turns=3,
            concurrency=2,
            system_tokens=200,
            answer_tokens=(6, 10),
            think_s=0.02,
            output_lines=2,
            prefix_cache_blocks=4096,
            decode_step_s=0.005,
            decode_step_s_per_seq=0.0,
            prefill_s_per_token=0.00002,
            runs=tuple(r for r in runs if r != "affinity_opening"),
            probe_interval_s=0.2,
            scrape_interval_s=0.2,
            state_interval_s=0.1,
            deadline_s=60.0,
        )
    try:
        run_specs(cfg)
    except ValueError as exc:
        p.error(str(exc))
    return common, cfg


def main(argv: Sequence[str] | None = None) -> int:
    common, cfg = parse(sys.argv[1:] if argv is None else argv)
    when = harness.stamp()
    logs = common.results_dir / f"{SCENARIO}-{when}-logs"

    def count(text: str) -> int:
        return count_prompt([{"role": "system", "content": text}], None, thinking=False).tokens

    system = system_prompt(cfg.system_tokens, count)
    sizes = workload_sizes(cfg, system)
    load_before = loadavg()
    harness.note(f"scenario F (fleet): load average {load_before}; workload {sizes}")
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    for spec in run_specs(cfg):
        # One run's processes failing (a port taken, a crash) must not cost the others.
        try:
            rows.append(run_one(common, cfg, spec, system, logs / spec.name))
        except (ProcessFailed, httpx.HTTPError) as exc:
            harness.note(f"  {label(spec)}: FAILED: {exc}")
            failed[spec.name] = f"{type(exc).__name__}: {exc}"
    wall_s = time.monotonic() - started
    verdicts = targets(rows)
    path = harness.write_result(
        common,
        SCENARIO,
        when,
        {
            "config": attrs.asdict(cfg),
            "workload": sizes,
            "loadavg_before": load_before,
            "wall_s": wall_s,
            "rows": rows,
            "failed_runs": failed,
            "targets": verdicts,
            "log_problems": {
                str(p.relative_to(logs)): harness.log_problems(p) for p in logs.rglob("*.log")
            },
        },
    )
    print(table(rows))
    print(harness.targets_text(verdicts))
    harness.note(f"results: {path} ({wall_s:.0f} s)")
    if common.plots and rows:
        from bench.fleet_plots import plot_fleet

        for png in plot_fleet(common.plots_dir, rows, cfg.turns):
            harness.note(f"plot: {png}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
