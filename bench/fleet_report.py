"""Scenario F's report (``bench/fleet.py``): the arithmetic over a run's counters, load samples
and turns (hit rates, the load spread, what the kill did in each window), the results table,
and issue 13's targets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs

from bench import harness
from bench.fleet_load import LoadSeries, Turn
from bench.fleet_model import Chaos
from bench.harness import fmt


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
