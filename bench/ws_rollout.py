"""Scenario H, agent rollouts: the Responses API over HTTP against its WebSocket mode (issue 41).

An agent's rollout: 20 tool calls, then the answer, each tool's output some 2 KB, so the
conversation grows by about that much a turn. Two ways through the same gateway (a gateway
process per mode, each alone with the simulator while it is measured):

- ``http``: ``POST /v1/responses``, streamed, ``store: false``, the whole history each turn
  (every earlier output item and tool output), over one keep-alive connection;
- ``ws``: one WebSocket on ``/v1/responses`` per rollout, each turn a ``response.create``
  with ``previous_response_id`` and only the new tool output (the socket remembers the rest).

The simulator answers each turn from a script in the tool's output: a little reasoning and the
next call, or the answer. Reported per mode: a rollout's end-to-end time (p50, mean), a
turn's time to first output (request sent → its first output item or delta) p50/p99, the
gateway's CPU per turn (its process's CPU seconds over the run / turns), the simulator's (what
bounds the rest: it reads each turn's whole prompt, the same in both modes), and the bytes the
client sent (what the gateway received: bodies or messages) and received. ``--rounds`` runs
the modes alternately, pooled (the machine may be shared). Targets (issue 41): WebSocket
≥ 20 % faster end to end, and cheaper in gateway CPU per turn.

``--upstream vllm``: the same rollouts through the gateway to the real vLLM of the vLLM tier
(bench/ws_rollout_vllm.py): 10 calls a rollout, each a named ``tool_choice``, sized to fit
its 2,048 tokens of context.

    .venv/bin/python -m bench.ws_rollout
    .venv/bin/python -m bench.ws_rollout --smoke --no-plots
    .venv/bin/python -m bench.ws_rollout --upstream vllm
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs
import httpx
import trio
import trio_websocket

from bench import harness
from bench.harness import LABELS, Common, GatewaySettings, SimSettings, Stack, fmt
from bench.procstat import Sampler

SCENARIO = "ws_rollout"
HTTP, WS = "http", "ws"
SIM = "simulator"
VLLM = "vllm"
UPSTREAMS = (SIM, VLLM)
MODES = (HTTP, WS)
LABELS[HTTP] = "HTTP, store: false, full history"
LABELS[WS] = "WebSocket, previous_response_id"
TOOL: dict[str, Any] = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file of the repository.",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}
INSTRUCTIONS = "You are a coding agent. Read files with read_file."
WORDS = ("def", "return", "self", "import", "async", "await", "trio", "nursery", "cancel")


@attrs.frozen(kw_only=True)
class Config:
    rollouts: int
    concurrency: int  # rollouts at once
    tool_calls: int
    grow_bytes: int  # a tool output's size
    decode_tokens_per_s: float
    turn_timeout_s: float = 60.0
    upstream: str = SIM
    # In every rollout's first message: on vLLM, the mode and round, so that no rollout's
    # prompts are prefix-cache hits from another mode's (the rollouts are deterministic).
    tag: str = ""
    # vLLM's tiny random model neither calls a tool nor stops by itself: a call turn names the
    # tool (tool_choice) and is given room for the call; the answer runs to answer_tokens.
    call_tokens: int = 40
    answer_tokens: int = 16


@attrs.define
class Rollout:
    seconds: float = 0.0
    turns: int = 0
    ttfts_s: list[float] = attrs.field(factory=list)
    turn_s: list[float] = attrs.field(factory=list)
    sent_bytes: int = 0
    received_bytes: int = 0  # response bodies (HTTP) or messages (WebSocket)
    input_tokens: list[int] = attrs.field(factory=list)  # per turn, from its usage
    cached_tokens: list[int] = attrs.field(factory=list)
    error: str | None = None


def sim_script(step: int, last: bool) -> str:
    if last:
        steps: list[dict[str, Any]] = [{"text": f"Done: read {step} files."}]
    else:
        call = {"name": "read_file", "arguments": {"path": f"src/module_{step}.py"}}
        steps = [{"reasoning": f"step {step}: read the next file"}, {"tool_call": call}]
    return "<sim>" + json.dumps({"steps": steps}) + "</sim>"


def words(rng: random.Random, size: int) -> str:
    text: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(WORDS)
        text.append(word)
        length += len(word) + 1
    return " ".join(text)


def tool_output(cfg: Config, rng: random.Random, step: int, last: bool) -> str:
    """About ``grow_bytes`` of a file's text, and the simulator's script for the next turn."""
    text = words(rng, cfg.grow_bytes)
    return text if cfg.upstream == VLLM else text + "\n" + sim_script(step, last)


def first_input(cfg: Config, rollout: int) -> list[dict[str, Any]]:
    question = f"rollout {cfg.tag}{rollout}: read the modules one by one."
    if cfg.upstream == SIM:
        question += " " + sim_script(0, False)
    return [{"role": "user", "content": question}]


def body(
    cfg: Config, model: str, items: list[dict[str, Any]], step: int, **fields: Any
) -> dict[str, Any]:
    turn: dict[str, Any] = {"reasoning": {"effort": "low"}}
    if cfg.upstream == VLLM:
        last = step == cfg.tool_calls
        turn = {
            "reasoning": {"effort": "none"},  # thinking off: the tiny model's is noise
            "tool_choice": "none" if last else {"type": "function", "name": TOOL["name"]},
            "max_output_tokens": cfg.answer_tokens if last else cfg.call_tokens,
            "temperature": 0,
        }
    return {
        "model": model,
        "input": items,
        "tools": [TOOL],
        "instructions": INSTRUCTIONS,
        "store": False,
        **turn,
        **fields,
    }


FIRST_OUTPUT = "response.output_item.added"
DONE = ("response.completed", "response.failed", "response.incomplete")


def finished(cfg: Config, done: dict[str, Any] | None, step: int, out: Rollout) -> dict[str, Any]:
    """The turn's outcome checked, its usage kept. On vLLM the answer runs to its
    max_output_tokens (the tiny model never stops): incomplete is its way to finish."""
    status = None if done is None else done["status"]
    answer_cut = cfg.upstream == VLLM and step == cfg.tool_calls and status == "incomplete"
    if done is None or (status != "completed" and not answer_cut):
        raise RuntimeError(f"turn {step}: {status} {done and done.get('error')}")
    usage = done.get("usage") or {}
    out.input_tokens.append(int(usage.get("input_tokens") or 0))
    details = usage.get("input_tokens_details") or {}
    out.cached_tokens.append(int(details.get("cached_tokens") or 0))
    out.turns += 1
    return done


def next_output(
    cfg: Config, rng: random.Random, output: list[dict[str, Any]], step: int
) -> dict[str, Any]:
    call = next(item for item in output if item["type"] == "function_call")
    last = step + 1 == cfg.tool_calls
    return {
        "type": "function_call_output",
        "call_id": call["call_id"],
        "output": tool_output(cfg, rng, step + 1, last),
    }


async def http_rollout(port: int, model: str, cfg: Config, index: int, out: Rollout) -> None:
    rng = random.Random(index)
    items = first_input(cfg, index)
    url = f"http://127.0.0.1:{port}/v1/responses"
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=cfg.turn_timeout_s, trust_env=False) as client:
        for step in range(cfg.tool_calls + 1):
            payload = json.dumps(body(cfg, model, items, step, stream=True)).encode()
            out.sent_bytes += len(payload)
            sent = time.monotonic()
            first: float | None = None
            done: dict[str, Any] | None = None
            async with client.stream(
                "POST", url, content=payload, headers={"content-type": "application/json"}
            ) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code}")
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    kind = event["type"]
                    if first is None and (kind == FIRST_OUTPUT or kind.endswith(".delta")):
                        first = time.monotonic()
                    if kind in DONE:
                        done = event["response"]
                out.received_bytes += response.num_bytes_downloaded
            out.turn_s.append(time.monotonic() - sent)
            out.ttfts_s.append((first or time.monotonic()) - sent)
            done = finished(cfg, done, step, out)
            if step == cfg.tool_calls:
                break
            items = [*items, *done["output"], next_output(cfg, rng, done["output"], step)]
    out.seconds = time.monotonic() - started


async def ws_rollout(port: int, model: str, cfg: Config, index: int, out: Rollout) -> None:
    rng = random.Random(index)
    new_items = first_input(cfg, index)
    previous: str | None = None
    url = f"ws://127.0.0.1:{port}/v1/responses"
    started = time.monotonic()
    async with trio_websocket.open_websocket_url(url, max_message_size=64 * 1024 * 1024) as ws:
        for step in range(cfg.tool_calls + 1):
            fields: dict[str, Any] = {"type": "response.create"}
            if previous is not None:
                fields["previous_response_id"] = previous
            message = json.dumps(body(cfg, model, new_items, step, **fields))
            out.sent_bytes += len(message.encode())
            sent = time.monotonic()
            first: float | None = None
            done: dict[str, Any] | None = None
            await ws.send_message(message)
            while done is None:
                received = await ws.get_message()
                raw = received.encode() if isinstance(received, str) else received
                out.received_bytes += len(raw)
                event = json.loads(received)
                kind = event["type"]
                if first is None and (kind == FIRST_OUTPUT or kind.endswith(".delta")):
                    first = time.monotonic()
                if kind in DONE:
                    done = event["response"]
                elif kind == "error":
                    raise RuntimeError(f"turn {step}: {event['error']}")
            out.turn_s.append(time.monotonic() - sent)
            out.ttfts_s.append((first or time.monotonic()) - sent)
            done = finished(cfg, done, step, out)
            if step == cfg.tool_calls:
                break
            previous = done["id"]
            new_items = [next_output(cfg, rng, done["output"], step)]
    out.seconds = time.monotonic() - started


async def run_rollouts(port: int, model: str, mode: str, cfg: Config) -> list[Rollout]:
    results = [Rollout() for _ in range(cfg.rollouts)]
    indexes = iter(range(cfg.rollouts))
    one = http_rollout if mode == HTTP else ws_rollout

    async def agent() -> None:
        for i in indexes:  # shared: each rollout runs once
            try:
                await one(port, model, cfg, i, results[i])
            except Exception as exc:  # a failed rollout is reported, not raised
                results[i].error = f"{exc.__class__.__name__}: {exc}"

    async with trio.open_nursery() as nursery:
        for _ in range(cfg.concurrency):
            nursery.start_soon(agent)
    return results


def run_mode(st: Stack, mode: str, cfg: Config) -> dict[str, Any]:
    port, model = st.targets[mode]
    # The simulator too: its own work per turn (reading the whole prompt) bounds what the
    # gateway's side can change end to end.
    pid = st.pid(mode)
    assert pid is not None
    sampler = Sampler({mode: pid, SIM: st.sim.process.pid})
    with sampler:
        sampler.mark("start")
        started = time.monotonic()
        results = trio.run(run_rollouts, port, model, mode, cfg)
        wall_s = time.monotonic() - started
        sampler.mark("end")
        harness.settle(sampler, st, mode, 0.0)
    proc = harness.process_summary(sampler, mode)
    sim_proc = harness.process_summary(sampler, SIM)
    done = [r for r in results if r.error is None]
    turns = sum(r.turns for r in results)
    ttfts = [t for r in done for t in r.ttfts_s]
    seconds = [r.seconds for r in done]
    cpu_s = proc["cpu_s"] if proc else None
    return {
        "mode": mode,
        "label": LABELS[mode],
        "wall_s": wall_s,
        "rollouts": cfg.rollouts,
        "completed": len(done),
        "errors": [r.error for r in results if r.error is not None][:5],
        "turns": turns,
        "cpu_s": cpu_s,
        "sim_cpu_s": sim_proc["cpu_s"] if sim_proc else None,
        "rollouts_s": seconds,
        "ttfts_s": ttfts,
        "last_ttfts_s": [r.ttfts_s[-1] for r in done],
        "sent_bytes": [r.sent_bytes for r in done],
        "received_bytes": [r.received_bytes for r in done],
        **summary(seconds, ttfts, [r.ttfts_s[-1] for r in done], cpu_s, turns, done),
        "process": proc,
        "sim_stats": harness.sim_stats(st.sim_url),
    }


def summary(
    seconds: list[float],
    ttfts: list[float],
    last_ttfts: list[float],
    cpu_s: float | None,
    turns: int,
    done: Sequence[Rollout] | Sequence[tuple[int, int]],
) -> dict[str, Any]:
    """``done``: the completed rollouts, or their (sent, received) bytes."""
    pairs = [(d.sent_bytes, d.received_bytes) if isinstance(d, Rollout) else d for d in done]
    sent = [p[0] for p in pairs]
    received = [p[1] for p in pairs]
    return {
        "rollout_p50_s": statistics.median(seconds) if seconds else None,
        "rollout_mean_s": statistics.fmean(seconds) if seconds else None,
        "ttft_p50_s": harness.percentile(ttfts, 0.5),
        "ttft_p99_s": harness.percentile(ttfts, 0.99),
        # The last turns, where the two differ most: the history is longest.
        "ttft_last_p50_s": harness.percentile(last_ttfts, 0.5),
        "cpu_ms_per_turn": cpu_s * 1000 / turns if cpu_s and turns else None,
        "sent_kib_per_rollout": statistics.fmean(sent) / 1024 if sent else None,
        "received_kib_per_rollout": statistics.fmean(received) / 1024 if received else None,
    }


def pooled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rounds of each mode as one row: their rollouts, turns and CPU pooled."""
    out = []
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        cpu = [r["cpu_s"] for r in mine]
        cpu_s = sum(c for c in cpu if c is not None) if None not in cpu else None
        turns = sum(r["turns"] for r in mine)
        seconds = [x for r in mine for x in r["rollouts_s"]]
        row = {
            "mode": mode,
            "label": LABELS[mode],
            "rounds": len(mine),
            "rollouts": sum(r["rollouts"] for r in mine),
            "completed": sum(r["completed"] for r in mine),
            "loadavg_before": mine[0]["loadavg_before"],
            **summary(
                seconds,
                [x for r in mine for x in r["ttfts_s"]],
                [x for r in mine for x in r["last_ttfts_s"]],
                cpu_s,
                turns,
                [
                    (sent, received)
                    for r in mine
                    for sent, received in zip(r["sent_bytes"], r["received_bytes"], strict=True)
                ],
            ),
        }
        sim_cpu = [r.get("sim_cpu_s") for r in mine]
        row["sim_cpu_ms_per_turn"] = (
            sum(c for c in sim_cpu if c is not None) * 1000 / turns
            if turns and None not in sim_cpu
            else None
        )
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    rows = pooled(rows)
    header = ["mode", "rollouts", "rollout p50 / mean (s)", "TTFT p50 / p99 (ms)"]
    header += ["last turn's TTFT p50 (ms)", "gateway CPU (ms/turn)", "simulator CPU (ms/turn)"]
    header += ["sent / received (KiB/rollout)"]
    header += ["load avg"]
    out = []
    for r in rows:
        out.append(
            [
                r["label"],
                f"{r['completed']}/{r['rollouts']}",
                f"{fmt(r['rollout_p50_s'], 2)} / {fmt(r['rollout_mean_s'], 2)}",
                f"{fmt(r['ttft_p50_s'], 1, 1000)} / {fmt(r['ttft_p99_s'], 1, 1000)}",
                fmt(r["ttft_last_p50_s"], 1, 1000),
                fmt(r["cpu_ms_per_turn"], 2),
                fmt(r["sim_cpu_ms_per_turn"], 1),
                f"{fmt(r['sent_kib_per_rollout'], 0)} / {fmt(r['received_kib_per_rollout'], 0)}",
                fmt((r["loadavg_before"] or [None])[0], 2),
            ]
        )
    return harness.markdown_table(header, out)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {r["mode"]: r for r in pooled(rows)}
    http, ws = by.get(HTTP), by.get(WS)
    if http is None or ws is None:
        return [{"target": "both modes ran", "value": None, "met": False}]
    faster = (
        None
        if not http["rollout_p50_s"] or ws["rollout_p50_s"] is None
        else 1 - ws["rollout_p50_s"] / http["rollout_p50_s"]
    )
    cheaper = (
        None
        if http["cpu_ms_per_turn"] is None or ws["cpu_ms_per_turn"] is None
        else http["cpu_ms_per_turn"] - ws["cpu_ms_per_turn"]
    )
    return [
        {
            "target": "WebSocket ≥ 20 % faster end to end (rollout p50; fraction saved)",
            "value": faster,
            "met": None if faster is None else faster >= 0.2,
        },
        {
            "target": "WebSocket cheaper in gateway CPU per turn (ms saved)",
            "value": cheaper,
            "met": None if cheaper is None else cheaper > 0,
        },
    ]


@attrs.frozen(kw_only=True)
class VllmOptions:
    """The real vLLM's side (``--upstream vllm``), as bench/cancellation_vllm.py takes it."""

    url: str | None  # one already running; None: start the tier's, pinned
    api_key: str | None
    vllm_cpus: tuple[int, ...]
    bench_cpus: tuple[int, ...]
    max_num_seqs: int
    step_delay_ms: float


# Per upstream: (rollouts a round, tool calls, a tool output's bytes). On vLLM the whole
# rollout fits in its 2,048 tokens of context: half the simulator's turns, each output sized
# by vLLM's /tokenize so that the last turn fits (0: calibrated, bench/ws_rollout_vllm.py).
DEFAULTS = {SIM: (12, 20, 2048), VLLM: (6, 10, 0)}
SMOKE = {SIM: (2, 3, 512), VLLM: (1, 2, 0)}


def _cpus(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text.split(",") if c.strip())


def parse(argv: Sequence[str]) -> tuple[Common, Config, VllmOptions]:
    p = argparse.ArgumentParser(
        prog="python -m bench.ws_rollout",
        description="Scenario H: agent rollouts over HTTP against the WebSocket mode.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    harness.add_common(p, MODES)
    p.add_argument("--upstream", choices=UPSTREAMS, default=SIM)
    p.add_argument("--rollouts", type=int, default=None, help="a round's, per mode (12; vLLM 6)")
    p.add_argument("--concurrency", type=int, default=2, help="rollouts at once")
    p.add_argument("--tool-calls", type=int, default=None, help="per rollout (20; vLLM 10)")
    p.add_argument(
        "--grow-bytes", type=int, default=None, help="a tool output's size (2048; vLLM: fitted)"
    )
    p.add_argument("--decode-tokens-per-s", type=float, default=200.0, help="the simulator's speed")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="each mode this many times, alternating (the machine may be shared); pooled",
    )
    p.add_argument("--vllm-url", default=None, help="a running vLLM (root URL, no /v1)")
    p.add_argument("--vllm-api-key", default=None, help="its key, with --vllm-url")
    p.add_argument("--vllm-cpus", type=_cpus, default=(0,), help="vLLM's cores (taskset)")
    p.add_argument("--bench-cpus", type=_cpus, default=(1,), help="the gateways' and the load's")
    p.add_argument("--max-num-seqs", type=int, default=4, help="vLLM's, when started here")
    p.add_argument("--step-delay-ms", type=float, default=20.0, help="tools/vllm/serve.py's pacing")
    a = p.parse_args(argv)
    common = harness.common_from(p, a, MODES)
    rounds = 1 if common.smoke and a.upstream == VLLM else a.rounds  # vLLM's smoke: one
    if rounds > 1:
        common = attrs.evolve(common, modes=common.modes * rounds)
    sizes = (SMOKE if common.smoke else DEFAULTS)[a.upstream]
    rollouts, tool_calls, grow_bytes = (
        sizes
        if common.smoke
        else (
            a.rollouts or sizes[0],
            a.tool_calls or sizes[1],
            sizes[2] if a.grow_bytes is None else a.grow_bytes,
        )
    )
    options = VllmOptions(
        url=a.vllm_url.rstrip("/") if a.vllm_url else None,
        api_key=a.vllm_api_key,
        vllm_cpus=a.vllm_cpus,
        bench_cpus=a.bench_cpus,
        max_num_seqs=a.max_num_seqs,
        step_delay_ms=a.step_delay_ms,
    )
    return (
        common,
        Config(
            rollouts=rollouts,
            concurrency=1 if common.smoke else a.concurrency,
            tool_calls=tool_calls,
            grow_bytes=grow_bytes,
            decode_tokens_per_s=500.0 if common.smoke else a.decode_tokens_per_s,
            upstream=a.upstream,
        ),
        options,
    )


def main(argv: Sequence[str] | None = None) -> int:
    common, cfg, options = parse(sys.argv[1:] if argv is None else argv)
    if cfg.upstream == VLLM:
        # Here, not at the top: the vLLM side imports the test tier's server helpers, which
        # the simulator's runs (and make test's smoke) have no use for.
        from bench import ws_rollout_vllm

        return ws_rollout_vllm.run(common, cfg, options)
    when = harness.stamp()
    logs = common.results_dir / f"{SCENARIO}-{when}-logs"
    # Room for the whole rollout in one prompt (20 turns of 2 KB: some 12k tokens), a prefill
    # that costs what is not in the prefix cache (both modes send vLLM the same prompts).
    sim = SimSettings(
        max_num_seqs=max(8, cfg.concurrency),
        decode_step_s=1.0 / cfg.decode_tokens_per_s,
        prefill_s_per_token=0.00002,
        max_model_len=65536,
    )
    gateway = GatewaySettings(
        max_inflight=max(8, cfg.concurrency),
        queue_timeout_s=60.0,
        tables="[websocket.responses]\nmax_message_bytes = 16777216\nmax_queued_bytes = 16777216\n",
        server_extra="max_body_bytes = 16777216",
        provider_extra='capabilities = ["tools", "reasoning"]',
    )
    harness.run_scenario(
        common,
        scenario=SCENARIO,
        label="H",
        when=when,
        sim=sim,
        gateway=gateway,
        logs=logs,
        run_one=lambda st, mode: run_mode(st, mode, cfg),
        targets=targets,
        table=table,
        config=cfg,
        variants={HTTP: gateway, WS: gateway},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
