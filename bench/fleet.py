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

The parts: ``bench/fleet_model.py`` (the configuration and the runs), ``bench/fleet_load.py``
(the sessions), ``bench/fleet_processes.py`` (the processes of a run, the kill and restart),
``bench/fleet_report.py`` (the arithmetic, the table, the targets), ``bench/fleet_plots.py``;
here, one run end to end and the command line.

    .venv/bin/python -m bench.fleet
    .venv/bin/python -m bench.fleet --smoke --no-plots
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from bench import harness
from bench.fleet_load import (
    LoadSeries,
    Progress,
    Workload,
    run_sessions,
    sample_loads,
    system_prompt,
)
from bench.fleet_model import DEFAULT_RUNS, Chaos, Config, RunSpec, label, run_specs, workload_sizes
from bench.fleet_processes import (
    chaos,
    fleet,
    gateway_prefix,
    sim_counters,
    wait_idle,
    wait_scrape,
    warm_up,
)
from bench.fleet_report import (
    by_turn,
    client_rate,
    hit_rate,
    kill_report,
    load_spread,
    table,
    targets,
)
from bench.harness import ALIAS, Common, fmt
from bench.processes import ProcessFailed
from bench.procstat import loadavg
from trio_gateway.sim.text import count_prompt

SCENARIO = "fleet"


# ---------------------------------------------------------------- one run


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
