"""Scenario B, stream timing: 200 streams, 100 at once, 200 tokens each at 50 tokens/s.

What the middle does to the timing of a stream, and what a relayed chunk costs it. The simulator
runs a 20 ms decode step whatever the batch (``--decode-step-s 0.02``, nothing per sequence), so
every stream gets a token every 20 ms: 5,000 chunks/s in all. 100 clients each run one stream,
then the next, until 200 streams ran. Reported per mode: TTFT p50/p99 (request sent → first
content chunk), inter-chunk gap p50/p99 (between consecutive content chunks at the client, all
streams pooled), completions and failures, and for the proxy and the gateway the process's CPU
µs per relayed chunk (its CPU seconds over the run / SSE data events the clients received).

Targets (issue 12): ≤ 100 µs gateway CPU per chunk; gateway inter-chunk p99 within 10 ms of
direct; gateway TTFT p99 within 300 ms of direct. The ``nginx`` mode (issue 33) runs a real
nginx as a pass-through reverse proxy (``bench/nginx_proxy.py``): the same measurements, the
floor a proxy in C sets.

``--filter-patterns N`` adds a fourth mode, ``gateway+filter``: a second gateway, the same but
for an output filter of N literal patterns (``mask``, on content, reasoning and tool
arguments) on the alias, in the same run. Target (issue 30): ≤ 10 µs more CPU per chunk than
the gateway without it, and its inter-chunk p99 within 10 ms of direct. The patterns are
seeded lowercase words of 6 to 12 letters (some with a hyphen) that the simulator never says:
with 1,000 of them every one- and most two-letter word ends could begin a match, so most
chunks hold back a letter or two until the next one (the filter's bounded holdback), and
nothing is masked.

    .venv/bin/python -m bench.stream_timing
    .venv/bin/python -m bench.stream_timing --smoke --no-plots
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from bench import harness
from bench.harness import (
    FILTERED,
    LABELS,
    NGINX_MODE,
    Common,
    GatewaySettings,
    SimSettings,
    Stack,
    fmt,
)
from bench.streams import chat_request, closed_loop, failures_text, summarize

SCENARIO = "stream_timing"
MODES = ("direct", "naive", NGINX_MODE, "gateway")


@attrs.frozen(kw_only=True)
class Config:
    streams: int
    concurrency: int
    max_tokens: int
    tokens_per_s: float
    connect_timeout_s: float = 30.0
    filter_patterns: int = 0  # >0: the gateway+filter mode, with that many patterns


FILTER_NAME = "bench_words"


def filter_words(n: int, seed: int = 30) -> list[str]:
    """``n`` distinct literal patterns, none of them in the simulator's vocabulary."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: set[str] = set()
    while len(words) < n:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(6, 12)))
        if rng.random() < 0.2:
            cut = rng.randint(2, len(word) - 2)
            word = f"{word[:cut]}-{word[cut:]}"
        words.add(word)
    return sorted(words)


def filtered(settings: GatewaySettings, n: int) -> GatewaySettings:
    """The gateway's settings with an output filter of ``n`` patterns on the alias."""
    patterns = json.dumps(filter_words(n))  # a JSON array of plain strings is a TOML array
    return attrs.evolve(
        settings,
        alias_extra=f'output_filters = ["{FILTER_NAME}"]',
        tables=f'[filters.{FILTER_NAME}]\npatterns = {patterns}\naction = "mask"\n',
    )


def run_mode(st: Stack, mode: str, cfg: Config) -> dict[str, Any]:
    port, model = st.targets[mode]
    requests = [chat_request(port, model, cfg.max_tokens, f"b{i}") for i in range(cfg.streams)]
    sampler = harness.sampler_for(st, mode)
    with sampler:
        sampler.mark("start")
        started = time.monotonic()
        results = trio.run(closed_loop, port, requests, cfg.concurrency, cfg.connect_timeout_s)
        wall_s = time.monotonic() - started
        sampler.mark("end")
        harness.settle(sampler, st, mode, 0.0)
    summary = summarize(results, cfg.max_tokens)
    if mode == FILTERED:
        # Held-back letters go out with the next chunk, and at the end in a chunk of their
        # own: a filtered stream may count one content chunk more than it had tokens.
        done = sum(1 for r in results if r.error is None and r.done and r.finish_reason == "length")
        errorless = sum(1 for r in results if r.error is None)
        summary |= {"completed": done, "incomplete_without_error": errorless - done}
    proc = harness.process_summary(sampler, mode)
    cpu_us = (
        proc["cpu_s"] * 1e6 / summary["events"]
        if proc and proc["cpu_s"] and summary["events"]
        else None
    )
    return {
        "mode": mode,
        "label": LABELS[mode],
        "filter_patterns": cfg.filter_patterns if mode == FILTERED else 0,
        "wall_s": wall_s,
        **summary,
        "cpu_us_per_chunk": cpu_us,
        "process": proc,
        "sim_stats": harness.sim_stats(st.sim_url),
        "ttfts_s": [r.ttft_s for r in results if r.ttft_s is not None],
        "gaps_s": [g for r in results for g in r.gaps_s],
    }


def table(rows: list[dict[str, Any]]) -> str:
    header = ["mode", "completed", "TTFT p50 / p99 (ms)", "inter-chunk p50 / p99 (ms)"]
    header += ["CPU µs/chunk (middle)", "chunks relayed", "failures", "wall (s)", "load avg"]
    out = []
    for r in rows:
        out.append(
            [
                r["label"],
                f"{r['completed']}/{r['streams']}",
                f"{fmt(r['ttft_p50_s'], 0, 1000)} / {fmt(r['ttft_p99_s'], 0, 1000)}",
                f"{fmt(r['gap_p50_s'], 1, 1000)} / {fmt(r['gap_p99_s'], 1, 1000)}",
                fmt(r["cpu_us_per_chunk"], 0) if r["mode"] != "direct" else "-",
                f"{r['events']:,}",
                failures_text(r["failures"]),
                fmt(r["wall_s"], 1),
                fmt((r["loadavg_before"] or [None])[0], 2),
            ]
        )
    return harness.markdown_table(header, out)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {r["mode"]: r for r in rows}
    out: list[dict[str, Any]] = []
    gw = by.get("gateway")
    if gw is None:
        return out
    cpu = gw["cpu_us_per_chunk"]
    fil = by.get(FILTERED)
    if fil is not None:
        more = (
            None
            if cpu is None or fil["cpu_us_per_chunk"] is None
            else fil["cpu_us_per_chunk"] - cpu
        )
        out.append(
            {
                "target": f"{fil['filter_patterns']:,}-pattern filter ≤ 10 µs/chunk more CPU",
                "value": more,
                "met": None if more is None else more <= 10,
            }
        )
    out.append(
        {
            "target": "gateway CPU ≤ 100 µs/chunk",
            "value": cpu,
            "met": None if cpu is None else cpu <= 100,
        }
    )
    nginx = by.get(NGINX_MODE)
    if nginx is not None and cpu is not None and nginx["cpu_us_per_chunk"]:
        # Issues 33 and 43: within twice a C pass-through's CPU per chunk, in the same run.
        ratio = cpu / nginx["cpu_us_per_chunk"]
        out.append(
            {"target": "gateway CPU per chunk ≤ 2 x nginx's", "value": ratio, "met": ratio <= 2}
        )
    direct = by.get("direct")
    if direct is not None:
        for key, name, limit_ms, row in (
            ("gap_p99_s", "inter-chunk p99 within 10 ms of direct (ms over)", 10.0, gw),
            ("ttft_p99_s", "TTFT p99 within 300 ms of direct (ms over)", 300.0, gw),
            ("gap_p99_s", "filter: inter-chunk p99 within 10 ms of direct (ms over)", 10.0, fil),
        ):
            if row is None:
                continue
            if row[key] is None or direct[key] is None:
                out.append({"target": name, "value": None, "met": False})
                continue
            over_ms = (row[key] - direct[key]) * 1000
            out.append({"target": name, "value": over_ms, "met": over_ms <= limit_ms})
    return out


def parse(argv: Sequence[str]) -> tuple[Common, Config]:
    p = argparse.ArgumentParser(
        prog="python -m bench.stream_timing",
        description="Scenario B: TTFT, inter-chunk gaps and CPU per relayed chunk.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    harness.add_common(p, MODES)
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=100, help="streams at once")
    p.add_argument("--max-tokens", type=int, default=200, help="tokens per stream")
    p.add_argument("--tokens-per-s", type=float, default=50.0, help="per stream")
    p.add_argument(
        "--filter-patterns",
        type=int,
        default=0,
        help="N > 0: also run gateway+filter, an output filter of N patterns on the alias",
    )
    a = p.parse_args(argv)
    common = harness.common_from(p, a, MODES)
    if a.filter_patterns > 0 and "gateway" in common.modes:
        common = attrs.evolve(common, modes=(*common.modes, FILTERED))
    if common.smoke:
        return common, Config(
            streams=8, concurrency=4, max_tokens=20, tokens_per_s=100.0,
            filter_patterns=a.filter_patterns,
        )  # fmt: skip
    return common, Config(
        streams=a.streams,
        concurrency=a.concurrency,
        max_tokens=a.max_tokens,
        tokens_per_s=a.tokens_per_s,
        filter_patterns=a.filter_patterns,
    )


def main(argv: Sequence[str] | None = None) -> int:
    common, cfg = parse(sys.argv[1:] if argv is None else argv)
    when = harness.stamp()
    logs = common.results_dir / f"{SCENARIO}-{when}-logs"
    # A step per token for every stream at once: the batch holds every concurrent stream, and
    # its time does not grow with the batch, so each stream gets exactly tokens_per_s.
    sim = SimSettings(max_num_seqs=cfg.concurrency, decode_step_s=1.0 / cfg.tokens_per_s)
    # A slot for every concurrent stream (the simulator's batch size): nobody waits or is refused.
    gateway = GatewaySettings(max_inflight=cfg.concurrency, queue_timeout_s=60.0)
    rows = harness.run_scenario(
        common,
        scenario=SCENARIO,
        label="B",
        when=when,
        sim=sim,
        gateway=gateway,
        logs=logs,
        run_one=lambda st, mode: run_mode(st, mode, cfg),
        targets=targets,
        table=table,
        config=cfg,
        variants={FILTERED: filtered(gateway, cfg.filter_patterns)}
        if cfg.filter_patterns
        else None,
    )
    if common.plots:
        from bench.plots import cdf_panels

        png = cdf_panels(
            common.plots_dir / f"{SCENARIO}.png",
            f"B, stream timing: {cfg.streams} streams, {cfg.concurrency} at once, "
            f"{cfg.max_tokens} tokens at {cfg.tokens_per_s:g}/s",
            [
                (
                    "time to first token",
                    "ms",
                    {r["label"]: [x * 1000 for x in r["ttfts_s"]] for r in rows},
                ),
                (
                    "gap between content chunks",
                    "ms",
                    {r["label"]: [x * 1000 for x in r["gaps_s"]] for r in rows},
                ),
            ],
        )
        harness.note(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
