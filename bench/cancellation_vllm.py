"""Scenario C on a real vLLM (issue 33): clients that leave early, direct vs gateway vs naive.

Seed 2's experiment (upstream-facts section 4) on the CPU vLLM of the real-vLLM tier
(tools/vllm/, the tiny random Qwen3) instead of the simulator: N streams start together, a
seeded 40 % of the clients close their connection after L tokens, and the same load runs
three ways through one vLLM (``--max-num-seqs 8``), one mode after another:

- ``direct``: clients talk to vLLM, which aborts a request when its client leaves;
- ``gateway``: through ``trio-gateway serve``, ``max_inflight`` = vLLM's ``max-num-seqs``;
- ``naive``: through ``bench/naive_proxy.py``, which never passes a disconnect on (last: it
  leaves vLLM generating for nobody, and the next mode would share the engine with that).

vLLM runs pinned to one core (``taskset -c 0``, and its OpenMP threads bound there); this
process, the gateway and the naive proxy (which inherit its affinity) run on the other.

Measured per mode: TTFT p50/p99, useful tokens/s (tokens the staying clients received, over
the wall time) and tokens vLLM generated for nobody: the delta of vLLM's own
``vllm:generation_tokens_total`` minus the tokens all clients received. To count received
tokens exactly whatever vLLM puts in a chunk, every request carries ``allowed_token_ids``: the
tiny tokenizer's single-character ASCII tokens, so one character is one token.

    .venv/bin/python -m bench.cancellation_vllm               # about 3 minutes, see --help
    .venv/bin/python -m bench.cancellation_vllm --smoke       # tiny sizes
    .venv/bin/python -m bench.cancellation_vllm --vllm-url http://127.0.0.1:8000 \\
        --vllm-api-key KEY --max-num-seqs 4                   # a vLLM already running

Prints a markdown table and the verdicts; writes ``bench/results/cancellation_vllm-<time>.json``.
See docs/benchmarks.md, "C on real vLLM (issue 33)".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx
import trio
from tests.vllm.vllm_server import group_pids

from bench import harness
from bench.cancellation_load import LoadOutcome, run_load
from bench.processes import PYTHON, Child, free_port, running
from bench.procstat import loadavg
from bench.vllm_upstream import (
    Upstream,
    affinities,
    counters,
    filler_words,
    group_cpu_s,
    message,
    single_char_tokens,
    vllm,
    wait_idle,
)

SCENARIO = "cancellation_vllm"
MODES = ("direct", "gateway", "naive")
LABELS = {"direct": "direct to vLLM", "gateway": "trio-gateway", "naive": "naive proxy"}
KEY_ENV = "TRIO_GATEWAY_BENCH_VLLM_KEY"  # the gateway reads vLLM's key from here
HTTP_TIMEOUT_S = 30.0


@attrs.frozen(kw_only=True)
class Config:
    streams: int
    prompt_tokens: int  # aimed at; the JSON has what vLLM counted
    max_tokens: int
    leave_fraction: float
    leave_after: int
    max_num_seqs: int
    max_inflight: int
    step_delay_ms: float
    queue_timeout_s: float
    seed: int
    deadline_s: float
    drain_timeout_s: float
    poll_s: float
    stagger_ms: float
    vllm_cpus: tuple[int, ...]
    bench_cpus: tuple[int, ...]
    vllm_url: str | None
    vllm_api_key: str | None


SMOKE = {"streams": 10, "prompt_tokens": 40, "max_tokens": 120, "leave_after": 8}


def _cpus(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text.split(",") if c.strip())


def parse_args(argv: Sequence[str]) -> tuple[harness.Common, Config]:
    p = argparse.ArgumentParser(
        prog="python -m bench.cancellation_vllm",
        description="Clients that leave early, on a real CPU vLLM: direct vs gateway vs naive.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    harness.add_common(p)
    p.set_defaults(modes=",".join(MODES))
    p.add_argument("--streams", type=int, default=25)
    p.add_argument("--prompt-tokens", type=int, default=125)
    p.add_argument("--max-tokens", type=int, default=500)
    p.add_argument("--leave-fraction", type=float, default=0.4)
    p.add_argument("--leave-after", type=int, default=25, help="tokens, then close")
    p.add_argument("--max-num-seqs", type=int, default=8, help="vLLM's; the gateway's max_inflight")
    p.add_argument(
        "--max-inflight",
        type=int,
        default=None,
        help="the gateway's (default: --max-num-seqs); above it, vLLM holds a queue of its own",
    )
    p.add_argument(
        "--step-delay-ms", type=float, default=20.0, help="tools/vllm/serve.py's engine pacing"
    )
    p.add_argument("--queue-timeout-s", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=1, help="chooses which clients leave")
    p.add_argument("--deadline-s", type=float, default=600.0, help="per mode, for the clients")
    p.add_argument("--drain-timeout-s", type=float, default=300.0, help="then, for vLLM's idle")
    p.add_argument("--poll-s", type=float, default=0.25, help="sampling of vLLM's /metrics")
    p.add_argument(
        "--stagger-ms",
        type=float,
        default=20.0,
        help="stream i starts i x this after the first: the same arrival order in every mode",
    )
    p.add_argument("--vllm-cpus", type=_cpus, default=(0,), help="vLLM's cores (taskset)")
    p.add_argument("--bench-cpus", type=_cpus, default=(1,), help="everything else's cores")
    p.add_argument("--vllm-url", default=None, help="use this running vLLM (root URL, no /v1)")
    p.add_argument("--vllm-api-key", default=None, help="its key, with --vllm-url")
    a = p.parse_args(argv)
    common = harness.common_from(p, a)
    sizes = {k: getattr(a, k) for k in SMOKE} | (SMOKE if a.smoke else {})
    if sizes["leave_after"] >= sizes["max_tokens"] or a.streams < 1 or a.max_num_seqs < 1:
        p.error("--leave-after must be below --max-tokens; --streams, --max-num-seqs ≥ 1")
    return common, Config(
        **sizes,
        leave_fraction=a.leave_fraction,
        max_num_seqs=a.max_num_seqs,
        max_inflight=a.max_inflight or a.max_num_seqs,
        step_delay_ms=a.step_delay_ms,
        queue_timeout_s=a.queue_timeout_s,
        seed=a.seed,
        deadline_s=a.deadline_s,
        drain_timeout_s=a.drain_timeout_s,
        poll_s=a.poll_s,
        stagger_ms=a.stagger_ms,
        vllm_cpus=a.vllm_cpus,
        bench_cpus=a.bench_cpus,
        vllm_url=a.vllm_url.rstrip("/") if a.vllm_url else None,
        vllm_api_key=a.vllm_api_key,
    )


# ---------------------------------------------------------------- the load


def request_body(config: Config, model: str, tag: str, words: int, ids: list[int]) -> Any:
    return {
        "model": model,
        "messages": [message(tag, words)],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": config.max_tokens,
        "ignore_eos": True,
        "allowed_token_ids": ids,
        "chat_template_kwargs": {"enable_thinking": False},
    }


# ---------------------------------------------------------------- the middle processes


@contextlib.contextmanager
def middles(
    common: harness.Common, config: Config, up: Upstream, logs: Path
) -> Iterator[dict[str, tuple[str, Child | None]]]:
    """mode -> (chat URL, the process in the middle): the gateway and the naive proxy the modes
    need, started with this process's affinity (the bench cores)."""
    port = urlsplit(up.root_url).port
    assert port is not None, up.root_url
    targets: dict[str, tuple[str, Child | None]] = {"direct": (up.root_url, None)}
    with contextlib.ExitStack() as stack:
        if "gateway" in common.modes:
            os.environ[KEY_ENV] = up.api_key  # inherited by the gateway only through its env
            gw_port = free_port()
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
            settings = harness.GatewaySettings(
                max_inflight=config.max_inflight,
                queue_timeout_s=config.queue_timeout_s,
                provider_extra=f'api_key_env = "{KEY_ENV}"',
            )
            toml = folder / "gateway.toml"
            toml.write_text(harness.gateway_toml(settings, gw_port, port), encoding="utf-8")
            argv = [PYTHON, "-m", "trio_gateway", "serve", "--config", str(toml)]
            argv += ["--log-level", common.gateway_log_level]
            url = f"http://127.0.0.1:{gw_port}"
            child = stack.enter_context(
                running("gateway", argv, log_path=logs / "gateway.log", ready_url=f"{url}/healthz")
            )
            targets["gateway"] = (url, child)
        if "naive" in common.modes:
            nv_port = free_port()
            url = f"http://127.0.0.1:{nv_port}"
            argv = [PYTHON, "-m", "bench.naive_proxy", "--listen", f"127.0.0.1:{nv_port}"]
            argv += ["--upstream", up.root_url]
            child = stack.enter_context(
                running("naive proxy", argv, log_path=logs / "naive.log", ready_url=f"{url}/health")
            )
            targets["naive"] = (url, child)
        yield targets


def warm_up(url: str, model: str, up: Upstream) -> None:
    """Two tiny streams through the mode's path, not measured (first-request imports)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "warm up"}],
        "stream": True,
        "max_tokens": 2,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False, headers=up.headers) as client:
        for _ in range(2):
            response = client.post(f"{url}/v1/chat/completions", json=body)
            response.raise_for_status()


# ---------------------------------------------------------------- one mode


def run_mode(
    config: Config,
    mode: str,
    target: tuple[str, Child | None],
    up: Upstream,
    prompt: tuple[int, int],
    ids: list[int],
) -> dict[str, Any]:
    url, child = target
    model = harness.SERVED_MODEL if mode != "gateway" else harness.ALIAS
    warm_up(url, model, up)
    wait_idle(up)
    # The mode in every tag: no prompt of this run is a prefix-cache hit from an earlier mode.
    bodies = [
        request_body(config, model, f"{mode}{i}", prompt[0], ids) for i in range(config.streams)
    ]
    before, load_before = counters(up), loadavg()
    cpu_before = (group_cpu_s(up.pgid), child.cpu_seconds() if child else None)
    outcome = trio.run(
        partial(
            run_load,
            config,
            f"{url}/v1/chat/completions",
            up.root_url,
            bodies,
            up.headers,
            chars_are_tokens=True,
            stagger_s=config.stagger_ms / 1000,
        )
    )
    wait_idle(up)  # run_load waited already, unless its drain timed out
    after = counters(up)
    cpu_after = (group_cpu_s(up.pgid), child.cpu_seconds() if child else None)
    if child is not None:
        child.check_alive()
    row = summarize(config, mode, outcome, before, after)
    row["loadavg_before"] = load_before
    row["cpu_s"] = {
        "vllm": _delta(cpu_before[0], cpu_after[0]),
        "middle": _delta(cpu_before[1], cpu_after[1]),
    }
    return row


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def summarize(
    config: Config,
    mode: str,
    outcome: LoadOutcome,
    before: dict[str, float],
    after: dict[str, float],
) -> dict[str, Any]:
    streams = outcome.streams
    stayers = [s for s in streams if not s.leaves]
    leavers = [s for s in streams if s.leaves]
    ttfts = [s.ttft_s for s in streams if s.ttft_s is not None]
    ends = [s.end_s for s in streams if s.end_s is not None]
    wall_s = max(ends) if ends else outcome.clients_done_s
    useful = sum(s.tokens for s in stayers)
    delivered = sum(s.tokens for s in streams)

    def grew(name: str) -> int:
        return round(after.get(name, 0.0) - before.get(name, 0.0))

    generated = grew("vllm:generation_tokens_total")
    return {
        "mode": mode,
        "label": LABELS[mode]
        + (f" (max_inflight {config.max_inflight})" if mode == "gateway" else ""),
        "ttft_p50_s": harness.percentile(ttfts, 0.5),
        "ttft_p99_s": harness.percentile(ttfts, 0.99),
        "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None,
        "useful_tokens": useful,
        "useful_tokens_per_s": useful / wall_s if wall_s > 0 else None,
        "delivered_tokens": delivered,
        "generated_tokens": generated,
        "wasted_tokens": generated - delivered,
        # What the leavers did not read: all of it is generated for nobody when no leave is
        # passed on (the naive proxy's waste, exactly, if nothing else goes wrong).
        "leavers_unread_tokens": sum(config.max_tokens - s.tokens for s in leavers),
        "aborts": grew("started_unfinished"),
        "prompt_tokens": grew("vllm:prompt_tokens_total"),
        "prompt_tokens_cached": grew("vllm:prompt_tokens_cached_total"),
        "prompt_tokens_per_stream": sorted({s.prompt_tokens for s in stayers} - {None}),
        "wall_s": wall_s,
        "vllm_idle_s": outcome.sim_idle_s,
        "max_running": max((x.running for x in outcome.samples), default=None),
        "max_waiting": max((x.waiting for x in outcome.samples), default=None),
        "stayers": len(stayers),
        "stayers_complete": sum(
            1 for s in stayers if s.tokens == config.max_tokens and s.finish_reason == "length"
        ),
        "leavers": len(leavers),
        "leavers_left": sum(1 for s in leavers if s.left),
        "errors": [f"stream {s.index}: {s.error}" for s in streams if s.error],
        "clients_timed_out": outcome.clients_timed_out,
        "samples": [attrs.astuple(x) for x in outcome.samples],
        "streams": [attrs.asdict(s) for s in streams],
        "ttfts_s": ttfts,
    }


# ---------------------------------------------------------------- verdicts and output

WITHIN = 0.05


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gateway within 5 % of direct on each of the three. One-sided: better than direct
    is within. For the waste, 5 % of what the leavers left unread (the naive proxy's waste,
    the most there is to save) on top of direct's own."""
    by_mode = {r["mode"]: r for r in rows}
    direct, gateway = by_mode.get("direct"), by_mode.get("gateway")
    if direct is None or gateway is None:
        return [{"target": "gateway within 5 % of direct (needs both modes)", "value": None,
                 "met": None}]  # fmt: skip
    out = []
    for key, name in (("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99")):
        ratio = _ratio(gateway[key], direct[key])
        out.append(
            {
                "target": f"gateway {name} ≤ 1.05 x direct's (ratio)",
                "value": ratio,
                "met": None if ratio is None else ratio <= 1 + WITHIN,
            }
        )
    ratio = _ratio(gateway["useful_tokens_per_s"], direct["useful_tokens_per_s"])
    out.append(
        {
            "target": "gateway useful tok/s ≥ 0.95 x direct's (ratio)",
            "value": ratio,
            "met": None if ratio is None else ratio >= 1 - WITHIN,
        }
    )
    allowance = WITHIN * gateway["leavers_unread_tokens"]
    excess = gateway["wasted_tokens"] - direct["wasted_tokens"]
    out.append(
        {
            "target": "gateway tokens for nobody ≤ direct's + 5 % of the leavers' unread "
            f"tokens ({allowance:,.0f}) (excess over direct)",
            "value": excess,
            "met": excess <= allowance,
        }
    )
    out.append(
        {
            "target": "gateway: every leaver aborted in vLLM (aborts / leavers)",
            "value": gateway["aborts"] / max(1, gateway["leavers"]),
            "met": gateway["aborts"] >= gateway["leavers"],
        }
    )
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


COLUMNS = (
    "mode",
    "TTFT p50 (s)",
    "TTFT p99 (s)",
    "useful tok/s",
    "generated (vLLM)",
    "delivered",
    "generated for nobody",
    "aborts (vLLM)",
    "total time (s)",
    "max running / waiting (vLLM)",
    "CPU s vLLM / middle",
    "errors",
    "load avg",
)


def table(rows: list[dict[str, Any]]) -> str:
    fmt = harness.fmt
    lines = []
    for r in rows:
        cpu = r["cpu_s"]
        lines.append(
            [
                r["label"],
                fmt(r["ttft_p50_s"], 2),
                fmt(r["ttft_p99_s"], 2),
                fmt(r["useful_tokens_per_s"], 0),
                f"{r['generated_tokens']:,}",
                f"{r['delivered_tokens']:,}",
                f"{r['wasted_tokens']:,}",
                str(r["aborts"]),
                fmt(r["wall_s"], 1),
                f"{r['max_running']} / {r['max_waiting']}",
                f"{fmt(cpu['vllm'], 1)} / {fmt(cpu['middle'], 1)}",
                str(len(r["errors"])),
                fmt(r["loadavg_before"][0], 2),
            ]
        )
    return harness.markdown_table(COLUMNS, lines)


def pin_self(cpus: tuple[int, ...]) -> list[int]:
    """This process (and so the gateway and the proxy it starts) on the bench cores, when the
    machine has them; vLLM gets its own through taskset."""
    available = os.sched_getaffinity(0)
    if cpus and set(cpus) <= available and len(available) > 1:
        os.sched_setaffinity(0, cpus)
    return sorted(os.sched_getaffinity(0))


def main(argv: Sequence[str] | None = None) -> int:
    common, config = parse_args(sys.argv[1:] if argv is None else argv)
    bench_cpus = pin_self(config.bench_cpus)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    logs = common.results_dir / f"{SCENARIO}-{when}-logs"
    load_before = loadavg()
    harness.note(f"scenario C on real vLLM: load average {load_before}, bench on {bench_cpus}")
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with vllm(
        url=config.vllm_url,
        api_key=config.vllm_api_key,
        max_num_seqs=config.max_num_seqs,
        step_delay_ms=config.step_delay_ms,
        cpus=config.vllm_cpus,
    ) as up:
        harness.note(f"  vLLM at {up.root_url} ready after {time.monotonic() - started:.0f} s")
        ids = single_char_tokens(up)
        prompt = filler_words(up, config.prompt_tokens, "direct10")
        with middles(common, config, up, logs) as targets_by_mode:
            pids = {m: c.process.pid for m, (_, c) in targets_by_mode.items() if c is not None}
            if up.pgid is not None:
                pids |= {f"vllm {pid}": pid for pid in group_pids(up.pgid)}
            for mode in common.modes:
                harness.note(f"  {LABELS[mode]} (load average {loadavg()}) ...")
                row = run_mode(config, mode, targets_by_mode[mode], up, prompt, ids)
                harness.note(
                    f"    {row['wall_s']:.1f} s, {len(row['errors'])} errors, stayers complete"
                    f" {row['stayers_complete']}/{row['stayers']}, leavers left"
                    f" {row['leavers_left']}/{row['leavers']}"
                )
                rows.append(row)
            pinned = affinities(pids)  # after the load: threads started late are counted too
    verdicts = targets(rows)
    path = harness.write_result(
        common,
        SCENARIO,
        when,
        {
            "config": attrs.asdict(config),
            "prompt": {"filler_words": prompt[0], "tokens_calibrated": prompt[1]},
            "allowed_token_ids": ids,
            "affinity": {"bench": bench_cpus, **pinned},
            "loadavg_before": load_before,
            "wall_s": time.monotonic() - started,
            "rows": rows,
            "targets": verdicts,
            "log_problems": {p.name: harness.log_problems(p) for p in logs.glob("*.log")},
        },
    )
    print(table(rows))
    print(harness.targets_text(verdicts))
    harness.note(f"results: {path} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
