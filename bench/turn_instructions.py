"""Instructions the gateway executes per turn of scenario H's rollout, over HTTP and over the
Responses WebSocket mode, counted by valgrind (issue 41: "WebSocket cheaper in gateway CPU per
turn", asked of instruction counts instead of CPU time, which moves by ±15 % on a shared
2-core machine).

The rollouts are scenario H's own (``bench/ws_rollout.py``'s ``http_rollout`` and
``ws_rollout``: 20 tool calls and the answer, a tool's output some 2 KB, the HTTP client sending
the whole history each turn with ``store: false``, the WebSocket client only the new output
after ``previous_response_id``), one after the other, against the simulator (outside valgrind),
and the gateway configured as scenario H configures it, under ``valgrind --tool=cachegrind
--cache-sim=no``. As ``bench/request_instructions.py`` does, two runs per mode differ only in the
rollouts sent (``--rollouts``, then three times as many; a warm-up rollout first in both): the
difference of their totals over the turns it adds is the cost of one turn, start-up, imports and
shutdown cancelled out. Kernel work (system calls) is not counted.

``--annotate DIR`` keeps each run's cachegrind file there and writes, per mode, ``cg_diff`` of
the two runs (what the added turns cost, by C function) and its ``cg_annotate``: where a turn's
instructions go below the interpreter (msgspec's decoder, json's encoder, the regex engine,
the eval loop for the Python code itself).

    .venv/bin/python -m bench.turn_instructions [--rollouts 2 --tool-calls 20]

Needs valgrind (Debian: ``apt-get install valgrind``). A few minutes.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import trio

from bench import ws_rollout
from bench.harness import ALIAS, LABELS, GatewaySettings, SimSettings, gateway_toml
from bench.processes import PYTHON, free_port, running

READY_TIMEOUT_S = 900.0  # imports under valgrind take a minute or more on a shared machine
MODES = (ws_rollout.HTTP, ws_rollout.WS)


def sim_settings(cfg: ws_rollout.Config) -> SimSettings:
    """Scenario H's simulator (``ws_rollout.main``), at the decode speed asked for: the
    gateway's instructions per turn do not depend on it, the run's wall time does."""
    return SimSettings(
        max_num_seqs=8,
        decode_step_s=1.0 / cfg.decode_tokens_per_s,
        prefill_s_per_token=0.0,
        max_model_len=65536,
    )


# Scenario H's gateway (``ws_rollout.main``).
GATEWAY = GatewaySettings(
    max_inflight=8,
    queue_timeout_s=60.0,
    tables="[websocket.responses]\nmax_message_bytes = 16777216\nmax_queued_bytes = 16777216\n",
    server_extra="max_body_bytes = 16777216",
    provider_extra='capabilities = ["tools", "reasoning"]',
)


async def rollouts(port: int, mode: str, cfg: ws_rollout.Config, first: int, count: int) -> int:
    """``count`` rollouts one after the other (numbered from ``first``); the turns answered
    (a failed rollout stops the run: a count of failures is no count of turns)."""
    one = ws_rollout.http_rollout if mode == ws_rollout.HTTP else ws_rollout.ws_rollout
    turns = 0
    for index in range(first, first + count):
        out = ws_rollout.Rollout()
        await one(port, ALIAS, cfg, index, out)
        turns += out.turns
    return turns


def instructions(
    args: argparse.Namespace,
    cfg: ws_rollout.Config,
    work: Path,
    sim_port: int,
    mode: str,
    count: int,
) -> tuple[int, int, Path]:
    """One run: the gateway under cachegrind, a warm-up rollout, ``count`` rollouts. Its
    instructions (every thread), the turns counted, and its cachegrind file."""
    run = work / f"{mode}-{count}"
    run.mkdir()
    port = free_port()
    config = run / "gateway.toml"  # the default ledger lands beside it
    config.write_text(gateway_toml(GATEWAY, port, sim_port), encoding="utf-8")
    out = run / "cachegrind.out"
    argv = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}"]
    argv += [PYTHON, "-m", "trio_gateway", "serve", "--config", str(config)]
    argv += ["--log-level", args.log_level]
    with running(
        "gateway",
        argv,
        log_path=run / "gateway.log",
        ready_url=f"http://127.0.0.1:{port}/healthz",
        ready_timeout_s=READY_TIMEOUT_S,
    ):
        # The warm-up numbers its rollouts apart from the counted ones (their own random text).
        trio.run(rollouts, port, mode, cfg, 10_000, 1)
        turns = trio.run(rollouts, port, mode, cfg, 0, count)
    match = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no summary line in {out}")
    return int(match.group(1)), turns, out


def annotate(folder: Path, mode: str, short: Path, long: Path) -> Path:
    """``cg_diff`` of the two runs (the added rollouts alone) and its ``cg_annotate``."""
    folder.mkdir(parents=True, exist_ok=True)
    diff = folder / f"{mode}.diff.out"
    with diff.open("wb") as f:
        subprocess.run(["cg_diff", str(short), str(long)], stdout=f, check=True)
    text = folder / f"{mode}.annotate.txt"
    with text.open("wb") as f:
        subprocess.run(["cg_annotate", "--auto=no", str(diff)], stdout=f, check=True)
    for one, name in ((short, "short"), (long, "long")):
        shutil.copy(one, folder / f"{mode}.{name}.out")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rollouts", type=int, default=2, help="rollouts of the first run")
    parser.add_argument("--tool-calls", type=int, default=20, help="per rollout, then the answer")
    parser.add_argument("--grow-bytes", type=int, default=2048, help="a tool output's size")
    parser.add_argument("--decode-tokens-per-s", type=float, default=2000.0)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--log-level", default="info", help="the gateway's --log-level")
    parser.add_argument("--annotate", type=Path, help="keep cachegrind's files and cg_annotate")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    cfg = ws_rollout.Config(
        rollouts=args.rollouts,
        concurrency=1,
        tool_calls=args.tool_calls,
        grow_bytes=args.grow_bytes,
        decode_tokens_per_s=args.decode_tokens_per_s,
    )
    sim_port = free_port()
    rows = []
    with tempfile.TemporaryDirectory(prefix="turn-instructions-") as tmp:
        work = Path(tmp)
        sim_argv = [PYTHON, "-m", "bench.sim_server", "--abort-log", str(work / "aborts.txt")]
        sim_argv += ["--", "--listen", f"127.0.0.1:{sim_port}", *sim_settings(cfg).flags()]
        with running(
            "simulator",
            sim_argv,
            log_path=work / "sim.log",
            ready_url=f"http://127.0.0.1:{sim_port}/health",
        ):
            for mode in args.modes:
                short, short_turns, short_out = instructions(
                    args, cfg, work, sim_port, mode, args.rollouts
                )
                long, long_turns, long_out = instructions(
                    args, cfg, work, sim_port, mode, 3 * args.rollouts
                )
                per_turn = (long - short) / (long_turns - short_turns)
                row = {
                    "mode": mode,
                    "runs": [
                        {"rollouts": args.rollouts, "turns": short_turns, "instructions": short},
                        {"rollouts": 3 * args.rollouts, "turns": long_turns, "instructions": long},
                    ],
                    "instructions_per_turn": round(per_turn),
                }
                if args.annotate is not None:
                    row["annotate"] = str(annotate(args.annotate, mode, short_out, long_out))
                rows.append(row)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(json.dumps({"commit": commit, "tool_calls": args.tool_calls, "modes": rows}))
    for row in rows:
        label = LABELS[row["mode"]]
        print(f"| {commit} | {label} | {row['instructions_per_turn'] / 1e6:.2f}M per turn |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
