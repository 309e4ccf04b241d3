"""Scenario A, overhead: tiny non-streamed requests (``max_tokens: 1``) at a fixed concurrency.

What the middle costs per request when the upstream costs nearly nothing: the simulator runs
with zero modelled step time, so its answer is its own CPU work only. N clients, each on one
keep-alive connection, send request after request for a fixed time (after a short warm-up that
is not counted). Reported per mode: requests/s, latency p50/p99, failures by kind, and for the
proxy and the gateway the process's CPU milliseconds per request and its RSS.

Targets (issue 12): gateway requests/s ≥ 2x the naive proxy's; ≤ 1 ms gateway CPU per request.

Two more modes than the three (issue 33): ``nginx``, a real nginx as a pass-through reverse
proxy (``bench/nginx_proxy.py``), the floor a proxy in C sets; and ``gateway-w2``, the same
gateway with ``[server] workers = 2`` (a supervisor and two worker processes on one socket,
CPU and RSS summed over the three), each worker with the single gateway's ``max_inflight``.

    .venv/bin/python -m bench.overhead                 # 50 clients, 10 s per mode
    .venv/bin/python -m bench.overhead --smoke --no-plots
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from bench import harness
from bench.harness import (
    GATEWAY_W2,
    LABELS,
    NGINX_MODE,
    Common,
    GatewaySettings,
    SimSettings,
    Stack,
    fmt,
)
from bench.rawhttp import RequestFailed, Response, connect, error_code, post_bytes

SCENARIO = "overhead"
MODES = ("direct", "naive", NGINX_MODE, "gateway", GATEWAY_W2)


@attrs.frozen(kw_only=True)
class Config:
    concurrency: int
    duration_s: float
    warmup_s: float
    upstream: str  # "fast" (bench/fast_upstream.py) or "sim"
    connect_timeout_s: float = 10.0


@attrs.define
class Worker:
    latencies_s: list[float] = attrs.Factory(list)  # requests finished in the window
    failures: Counter[str] = attrs.Factory(Counter)
    bad_answers: int = 0


async def _worker(
    worker: Worker, port: int, request: bytes, window: tuple[float, float], cfg: Config
) -> None:
    start, end = window
    stream: trio.SocketStream | None = None
    try:
        while (now := time.monotonic()) < end:
            try:
                if stream is None:
                    stream = await connect("127.0.0.1", port, timeout_s=cfg.connect_timeout_s)
                await stream.send_all(request)
                response = Response(stream)
                await response.read_head()
                body = await response.read_body()
            except (RequestFailed, trio.BrokenResourceError) as exc:
                kind = exc.kind if isinstance(exc, RequestFailed) else "broken"
                if now >= start:
                    worker.failures[kind] += 1
                if stream is not None:
                    await stream.aclose()
                stream = None
                continue
            done = time.monotonic()
            if now < start:
                continue  # warm-up
            if response.status != 200:
                worker.failures[f"http_{response.status}:{error_code(body)}"] += 1
            elif done <= end:
                answer = json.loads(body)
                if answer["choices"][0]["finish_reason"] != "length":
                    worker.bad_answers += 1
                worker.latencies_s.append(done - now)
            if response.headers.get("connection", "").lower() == "close":
                await stream.aclose()
                stream = None
    finally:
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()


async def _load(port: int, model: str, cfg: Config, marks: Any) -> list[Worker]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    request = post_bytes("127.0.0.1", port, harness.CHAT_PATH, body)
    workers = [Worker() for _ in range(cfg.concurrency)]
    t0 = time.monotonic()
    window = (t0 + cfg.warmup_s, t0 + cfg.warmup_s + cfg.duration_s)

    async def mark_window() -> None:
        await trio.sleep_until(trio.current_time() + cfg.warmup_s)
        marks("start")
        await trio.sleep_until(trio.current_time() + cfg.duration_s)
        marks("end")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(mark_window)
        for worker in workers:
            nursery.start_soon(_worker, worker, port, request, window, cfg)
    return workers


def run_mode(st: Stack, mode: str, cfg: Config) -> dict[str, Any]:
    port, model = st.targets[mode]
    sampler = harness.sampler_for(st, mode)
    with sampler:
        sampler.mark("before")
        workers = trio.run(_load, port, model, cfg, sampler.mark)
        harness.settle(sampler, st, mode, 0.0)
    latencies = [x for w in workers for x in w.latencies_s]
    failures: Counter[str] = Counter()
    for w in workers:
        failures.update(w.failures)
    proc = harness.process_summary(sampler, mode)
    cpu_ms = proc["cpu_s"] * 1000 / len(latencies) if proc and proc["cpu_s"] and latencies else None
    return {
        "mode": mode,
        "label": LABELS[mode],
        "requests": len(latencies),
        "requests_per_s": len(latencies) / cfg.duration_s,
        "latency_p50_s": harness.percentile(latencies, 0.5),
        "latency_p99_s": harness.percentile(latencies, 0.99),
        "failures": dict(failures),
        "bad_answers": sum(w.bad_answers for w in workers),
        "cpu_ms_per_request": cpu_ms,
        "process": proc,
        "sim_stats": harness.sim_stats(st.sim_url) if st.is_sim else None,
        "latencies_s": latencies,
    }


def table(rows: list[dict[str, Any]]) -> str:
    header = ["mode", "req/s", "latency p50 (ms)", "latency p99 (ms)", "failures"]
    header += ["CPU ms/request (middle process)", "RSS before / peak (MiB)", "load avg before"]
    out = []
    for r in rows:
        proc = r["process"] or {}
        rss = (
            f"{fmt(proc.get('rss_kib_before'), 0, 1 / 1024)} / "
            f"{fmt(proc.get('rss_kib_peak'), 0, 1 / 1024)}"
            if proc
            else "-"
        )
        out.append(
            [
                r["label"],
                fmt(r["requests_per_s"], 0),
                fmt(r["latency_p50_s"], 1, 1000),
                fmt(r["latency_p99_s"], 1, 1000),
                str(sum(r["failures"].values())),
                fmt(r["cpu_ms_per_request"], 3) if r["mode"] != "direct" else "-",
                rss,
                fmt((r["loadavg_before"] or [None])[0], 2),
            ]
        )
    return harness.markdown_table(header, out)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {r["mode"]: r for r in rows}
    out = []
    if "gateway" in by and "naive" in by:
        ratio = by["gateway"]["requests_per_s"] / max(by["naive"]["requests_per_s"], 1e-9)
        out.append(
            {"target": "gateway req/s ≥ 2x naive proxy", "value": ratio, "met": ratio >= 2.0}
        )
    if "gateway" in by and by["gateway"]["cpu_ms_per_request"] is not None:
        cpu = by["gateway"]["cpu_ms_per_request"]
        out.append({"target": "gateway CPU ≤ 1 ms/request", "value": cpu, "met": cpu <= 1.0})
    if "gateway" in by and GATEWAY_W2 in by:
        # Issue 43: two workers against one, on cores of their own (--gateway-cpus, with the
        # load and the upstream on --others-cpus); every process of each counted.
        one, two = by["gateway"], by[GATEWAY_W2]
        ratio = two["requests_per_s"] / max(one["requests_per_s"], 1e-9)
        out.append(
            {"target": "2 workers: req/s ≥ 1.6 x one's", "value": ratio, "met": ratio >= 1.6}
        )
        if one["cpu_ms_per_request"] and two["cpu_ms_per_request"] is not None:
            more = two["cpu_ms_per_request"] / one["cpu_ms_per_request"] - 1
            out.append(
                {
                    "target": "2 workers: CPU per request within 10 %",
                    "value": more,
                    "met": more <= 0.1,
                }
            )
    return out


def parse(argv: Sequence[str]) -> tuple[Common, Config]:
    p = argparse.ArgumentParser(
        prog="python -m bench.overhead",
        description="Scenario A: tiny non-streamed requests; req/s and CPU per request.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    harness.add_common(p, MODES)
    p.add_argument("--concurrency", type=int, default=50, help="clients, one connection each")
    p.add_argument("--duration-s", type=float, default=10.0, help="measured, per mode")
    p.add_argument("--warmup-s", type=float, default=1.0, help="before, not counted")
    p.add_argument(
        "--upstream",
        choices=("fast", "sim"),
        default="fast",
        help="fast: canned answers (bench/fast_upstream.py); sim: the vLLM simulator",
    )
    a = p.parse_args(argv)
    common = harness.common_from(p, a, MODES)
    if common.smoke:
        return common, Config(concurrency=4, duration_s=0.6, warmup_s=0.2, upstream=a.upstream)
    return common, Config(
        concurrency=a.concurrency,
        duration_s=a.duration_s,
        warmup_s=a.warmup_s,
        upstream=a.upstream,
    )


def two_workers(settings: GatewaySettings) -> GatewaySettings:
    """The gateway with ``[server] workers = 2``: the same ``max_inflight``, which the workers
    share through their supervisor (as one process would keep it), so that the row compares
    processes, not slots."""
    return attrs.evolve(settings, server_extra=f"{settings.server_extra}\nworkers = 2")


def main(argv: Sequence[str] | None = None) -> int:
    common, cfg = parse(sys.argv[1:] if argv is None else argv)
    when = harness.stamp()
    logs = common.results_dir / f"{SCENARIO}-{when}-logs"
    # The simulator as a near-free upstream: no modelled time, batch as large as the clients.
    sim = (
        SimSettings(max_num_seqs=max(64, cfg.concurrency), decode_step_s=0.0)
        if cfg.upstream == "sim"
        else None
    )
    # Enough slots for every client at once, and a long queue wait: nothing is refused.
    gateway = GatewaySettings(max_inflight=max(64, cfg.concurrency), queue_timeout_s=30.0)
    rows = harness.run_scenario(
        common,
        scenario=SCENARIO,
        label="A",
        when=when,
        sim=sim,
        gateway=gateway,
        logs=logs,
        run_one=lambda st, mode: run_mode(st, mode, cfg),
        targets=targets,
        table=table,
        config=cfg,
        extra={"upstream": "simulator" if sim else "bench/fast_upstream.py"},
        variants={GATEWAY_W2: two_workers(gateway)} if GATEWAY_W2 in common.modes else None,
    )
    if common.plots:
        from bench.plots import cdf_panels

        series = {r["label"]: [x * 1000 for x in r["latencies_s"]] for r in rows}
        png = cdf_panels(
            common.plots_dir / f"{SCENARIO}.png",
            f"A, overhead: latency of max_tokens=1 requests, {cfg.concurrency} clients",
            [("request latency", "ms", series)],
        )
        harness.note(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
