"""Scenario E, slow clients: 200 streams whose clients read at 1 KiB/s, next to normal streams.

A client that reads slower than its answer is generated must cost bounded memory and, past the
gateway's ``client_stall_timeout_s`` (5 s here, set in the generated config), be dropped with
its upstream closed; and it must not slow the other clients down. Each mode runs two phases:

1. **baseline**: the normal streams alone (20 streams of 400 tokens at 50 tokens/s);
2. **mixed**: 200 slow clients start (raw sockets, ``SO_RCVBUF`` 4 KiB set before connecting,
   256 bytes read every 0.25 s), each asking for 600 tokens; 2 s later the same normal
   streams as in the baseline. The phase ends ``--phase-s`` after the slow clients started:
   slow clients still connected then are closed by the benchmark ("cut").

Reported per mode: the normal streams' inter-chunk p99 and TTFT p99 in both phases; the slow
clients dropped by the server (EOF or reset before their answer ended) and when; the simulator's
aborts of slow sequences (upstream closed) and when, from its abort log; the gateway's
``gateway_cancellations_total{cause="client_stall"}``; RSS before / peak / after of the middle.

    .venv/bin/python -m bench.slow_clients
    .venv/bin/python -m bench.slow_clients --smoke --no-plots
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import attrs
import trio

from bench import harness
from bench.harness import LABELS, Common, GatewaySettings, SimSettings, Stack, fmt
from bench.rawhttp import RequestFailed, StreamResult, connect, stream_chat
from bench.sim_server import read_abort_log
from bench.streams import HOST, chat_request, summarize

SCENARIO = "slow_clients"
STALL_CAUSE = 'gateway_cancellations_total{cause="client_stall"}'


@attrs.frozen(kw_only=True)
class Config:
    slow: int
    slow_max_tokens: int
    read_bytes: int  # per read
    read_every_s: float
    rcvbuf: int
    normal: int
    normal_max_tokens: int
    tokens_per_s: float
    head_start_s: float
    phase_s: float
    stall_timeout_s: float
    connect_timeout_s: float = 30.0


@attrs.define
class Slow:
    started: float = 0.0
    bytes_read: int = 0
    outcome: str = "cut"  # complete | dropped (eof before the end) | reset | cut | <failure kind>
    ended_s: float | None = None  # from its start


async def _slow_client(slow: Slow, port: int, request: bytes, cfg: Config) -> None:
    slow.started = time.monotonic()
    stream: trio.SocketStream | None = None
    tail = b""
    try:
        stream = await connect(HOST, port, timeout_s=cfg.connect_timeout_s, rcvbuf=cfg.rcvbuf)
        await stream.send_all(request)
        while True:
            try:
                data = await stream.receive_some(cfg.read_bytes)
            except (trio.BrokenResourceError, OSError):
                slow.outcome = "reset"
                return
            if not data:
                # The chunked body's terminator means a whole answer; anything else: dropped.
                slow.outcome = "complete" if tail.endswith(b"0\r\n\r\n") else "dropped"
                return
            slow.bytes_read += len(data)
            tail = (tail + data)[-16:]
            await trio.sleep(cfg.read_every_s)  # the pace is the point: 1 KiB/s
    except RequestFailed as exc:
        slow.outcome = exc.kind
    finally:
        slow.ended_s = time.monotonic() - slow.started
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()


async def _phase(
    port: int, model: str, cfg: Config, with_slow: bool
) -> tuple[list[StreamResult], list[Slow]]:
    normal = [chat_request(port, model, cfg.normal_max_tokens, f"n{i}") for i in range(cfg.normal)]
    results = [StreamResult(index=i) for i in range(cfg.normal)]
    slows = [Slow() for _ in range(cfg.slow if with_slow else 0)]
    slow_request = chat_request(port, model, cfg.slow_max_tokens, "slow")

    async def normals() -> None:
        async with trio.open_nursery() as nursery:
            for result, request in zip(results, normal, strict=True):
                nursery.start_soon(
                    partial(stream_chat, connect_timeout_s=cfg.connect_timeout_s),
                    result,
                    HOST,
                    port,
                    request,
                )

    if not with_slow:
        await normals()
        return results, slows
    with trio.move_on_after(cfg.phase_s):
        async with trio.open_nursery() as nursery:
            for slow in slows:
                nursery.start_soon(_slow_client, slow, port, slow_request, cfg)
            await trio.sleep(cfg.head_start_s)
            await normals()
    # Past the phase: the slow clients still connected were closed by the cancellation ("cut").
    return results, slows


def run_mode(st: Stack, mode: str, cfg: Config) -> dict[str, Any]:
    port, model = st.targets[mode]
    baseline, _ = trio.run(_phase, port, model, cfg, False)
    harness.wait_sim_idle(st.sim_url, 60.0)
    st.abort_log.write_text("")
    stalls_before = (
        harness.gateway_metrics(port).get(STALL_CAUSE, 0.0) if mode == "gateway" else None
    )
    sampler = harness.sampler_for(st, mode)
    with sampler:
        sampler.mark("start")
        t0 = time.monotonic()
        mixed, slows = trio.run(_phase, port, model, cfg, True)
        sampler.mark("end")
        harness.settle(sampler, st, mode, 1.0 if cfg.phase_s < 10 else 5.0)
    # The proxy may still read what a cut client left; the sim must be idle to count aborts.
    harness.wait_sim_idle(st.sim_url, 60.0)
    stalls = None
    if stalls_before is not None:
        stalls = harness.gateway_metrics(port).get(STALL_CAUSE, 0.0) - stalls_before
    slow_aborts = [t - t0 for t, n, _ in read_abort_log(st.abort_log) if n == cfg.slow_max_tokens]
    outcomes: dict[str, int] = {}
    for slow in slows:
        outcomes[slow.outcome] = outcomes.get(slow.outcome, 0) + 1
    dropped = [s.ended_s for s in slows if s.outcome in ("dropped", "reset") and s.ended_s]
    base, mix = summarize(baseline, cfg.normal_max_tokens), summarize(mixed, cfg.normal_max_tokens)
    return {
        "mode": mode,
        "label": LABELS[mode],
        "baseline": base,
        "mixed": mix,
        "slow_outcomes": outcomes,
        "slow_dropped_after_p50_s": harness.percentile(dropped, 0.5),
        "slow_dropped_after_max_s": max(dropped, default=None),
        "slow_bytes_read_mean": sum(s.bytes_read for s in slows) / len(slows) if slows else None,
        "upstream_aborts": len(slow_aborts),
        "upstream_abort_after_p50_s": harness.percentile(slow_aborts, 0.5),
        "upstream_abort_after_max_s": max(slow_aborts, default=None),
        "gateway_client_stall_cancellations": stalls,
        "process": harness.process_summary(sampler, mode),
        "sim_stats": harness.sim_stats(st.sim_url),
        "baseline_gaps_s": [g for r in baseline for g in r.gaps_s],
        "mixed_gaps_s": [g for r in mixed for g in r.gaps_s],
        # When each gap ended, from the slow clients' start: where in the phase the tail is.
        "mixed_gap_ends_s": [t - t0 for r in mixed for t in r.gap_ends],
    }


def table(rows: list[dict[str, Any]]) -> str:
    header = ["mode", "normal completed (base / mixed)", "normal inter-chunk p99 base → mixed (ms)"]
    header += [
        "normal TTFT p99 base → mixed (ms)",
        "slow clients: outcome",
        "dropped after p50 / max (s)",
    ]
    header += [
        "upstream closed (sim aborts)",
        "client_stall (gateway)",
        "RSS before / peak / after (MiB)",
        "load avg",
    ]
    out = []
    for r in rows:
        b, m, p = r["baseline"], r["mixed"], r["process"]
        mib = 1 / 1024
        rss = (
            f"{fmt(p['rss_kib_before'], 0, mib)} / {fmt(p['rss_kib_peak'], 0, mib)} / "
            f"{fmt(p['rss_kib_after'], 0, mib)}"
            if p
            else "-"
        )
        out.append(
            [
                r["label"],
                f"{b['completed']}/{b['streams']} / {m['completed']}/{m['streams']}",
                f"{fmt(b['gap_p99_s'], 1, 1000)} → {fmt(m['gap_p99_s'], 1, 1000)}",
                f"{fmt(b['ttft_p99_s'], 0, 1000)} → {fmt(m['ttft_p99_s'], 0, 1000)}",
                ", ".join(f"{k} {v}" for k, v in sorted(r["slow_outcomes"].items())),
                f"{fmt(r['slow_dropped_after_p50_s'], 1)}"
                f" / {fmt(r['slow_dropped_after_max_s'], 1)}",
                str(r["upstream_aborts"]),
                fmt(r["gateway_client_stall_cancellations"], 0) if r["mode"] == "gateway" else "-",
                rss,
                fmt((r["loadavg_before"] or [None])[0], 2),
            ]
        )
    return harness.markdown_table(header, out)


def targets(rows: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    gw = next((r for r in rows if r["mode"] == "gateway"), None)
    if gw is None:
        return []
    # Dropped as the gateway counts it: the client only sees the drop once it has read what
    # its socket still held (seconds at 1 KiB/s), so its own view lags.
    dropped = int(gw["gateway_client_stall_cancellations"] or 0)
    b, m = gw["baseline"]["gap_p99_s"], gw["mixed"]["gap_p99_s"]
    delta_ms = (m - b) * 1000 if b is not None and m is not None else None
    p = gw["process"]
    growth = (p["rss_kib_peak"] - p["rss_kib_before"]) / 1024 if p and p["rss_kib_peak"] else None
    return [
        {
            "target": "slow clients dropped (gateway client_stall count)",
            "value": dropped,
            "met": dropped == cfg.slow,
        },
        {
            "target": "their upstreams closed (sim aborts)",
            "value": gw["upstream_aborts"],
            "met": gw["upstream_aborts"] >= dropped and dropped > 0,
        },
        {
            "target": "normal inter-chunk p99: mixed - baseline ≤ 10 ms",
            "value": delta_ms,
            "met": delta_ms is not None and delta_ms <= 10,
        },
        {
            "target": "RSS growth during the mixed phase (MiB; bounded)",
            "value": growth,
            "met": None,
        },
    ]


def parse(argv: Sequence[str]) -> tuple[Common, Config]:
    p = argparse.ArgumentParser(
        prog="python -m bench.slow_clients",
        description="Scenario E: clients reading at 1 KiB/s next to normal streams.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    harness.add_common(p)
    p.add_argument("--slow", type=int, default=200, help="slow clients")
    p.add_argument(
        "--slow-max-tokens",
        type=int,
        default=600,
        help="12 s of generation, 2 min of reading at 1 KiB/s",
    )
    p.add_argument("--read-bytes", type=int, default=256, help="per read of a slow client")
    p.add_argument("--read-every-s", type=float, default=0.25, help="256 B / 0.25 s = 1 KiB/s")
    p.add_argument("--rcvbuf", type=int, default=4096, help="slow clients' SO_RCVBUF")
    p.add_argument("--normal", type=int, default=20, help="normal streams")
    p.add_argument("--normal-max-tokens", type=int, default=400)
    p.add_argument("--tokens-per-s", type=float, default=50.0, help="per stream")
    p.add_argument("--head-start-s", type=float, default=2.0, help="slow clients start first")
    p.add_argument("--phase-s", type=float, default=20.0, help="mixed phase, then cut")
    p.add_argument(
        "--stall-timeout-s", type=float, default=5.0, help="gateway's client_stall_timeout_s"
    )
    a = p.parse_args(argv)
    common = harness.common_from(p, a)
    if common.smoke:
        smoke = Config(
            slow=3,
            slow_max_tokens=300,
            read_bytes=256,
            read_every_s=0.25,
            rcvbuf=4096,
            normal=3,
            normal_max_tokens=20,
            tokens_per_s=200.0,
            head_start_s=0.5,
            phase_s=2.5,
            stall_timeout_s=0.5,
        )
        return common, smoke
    return common, Config(
        slow=a.slow,
        slow_max_tokens=a.slow_max_tokens,
        read_bytes=a.read_bytes,
        read_every_s=a.read_every_s,
        rcvbuf=a.rcvbuf,
        normal=a.normal,
        normal_max_tokens=a.normal_max_tokens,
        tokens_per_s=a.tokens_per_s,
        head_start_s=a.head_start_s,
        phase_s=a.phase_s,
        stall_timeout_s=a.stall_timeout_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    common, cfg = parse(sys.argv[1:] if argv is None else argv)
    # The naive proxy last: it reads every cut client's answer to its end (it never sees the
    # client go), which keeps the simulator busy long after its phase; no mode comes after.
    order = ("direct", "gateway", "naive")
    common = attrs.evolve(common, modes=tuple(sorted(common.modes, key=order.index)))
    when = harness.stamp()
    logs = common.results_dir / f"{SCENARIO}-{when}-logs"
    slots = cfg.slow + cfg.normal + 8
    sim = SimSettings(max_num_seqs=slots, decode_step_s=1.0 / cfg.tokens_per_s)
    gateway = GatewaySettings(
        max_inflight=slots,
        queue_timeout_s=60.0,
        server_extra=f"client_stall_timeout_s = {cfg.stall_timeout_s!r}",
    )
    rows = harness.run_scenario(
        common,
        scenario=SCENARIO,
        label="E",
        when=when,
        sim=sim,
        gateway=gateway,
        logs=logs,
        run_one=lambda st, mode: run_mode(st, mode, cfg),
        targets=lambda rows: targets(rows, cfg),
        table=table,
        config=cfg,
    )
    if common.plots:
        from bench.plots import cdf_panels

        panels = [
            (
                f"{r['label']}: normal streams' gaps",
                "ms",
                {
                    "without slow clients": [g * 1000 for g in r["baseline_gaps_s"]],
                    f"with {cfg.slow} slow clients": [g * 1000 for g in r["mixed_gaps_s"]],
                },
            )
            for r in rows
        ]
        png = cdf_panels(
            common.plots_dir / f"{SCENARIO}.png",
            "E, slow clients: inter-chunk gaps of the normal streams",
            panels,
            log_x=True,
        )
        harness.note(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
