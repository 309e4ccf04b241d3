"""Instructions the gateway process executes per relayed chunk, counted by valgrind.

CPU time per chunk moves by ±15 % on a shared 2-core machine; instruction counts much less (the
same run repeated agrees to 0.01 %; the per-chunk figure, a difference of two runs, to a few %).
So each change to the per-chunk path is judged here first, and in the timed scenarios after.

The gateway runs under ``valgrind --tool=cachegrind --cache-sim=no`` (counts only), the
simulator and the load outside it. Two runs differ only in the tokens per stream (``--short``,
``--long``); the difference of their totals divided by the difference of their chunks is the
cost of one chunk, with start-up, imports and per-request work cancelled out. The streams are
slow (``--tokens-per-s`` each) so that every chunk is read, relayed and written on its own, as
at low load: no batching flatters the number.

    .venv/bin/python -m bench.chunk_instructions [--streams 4 --short 100 --long 500]

``--tracing 1.0``: with the gateway's own spans at that sample ratio, exported to
``bench/otlp_sink.py`` (outside valgrind).

Needs valgrind (Debian: ``apt-get install valgrind``). About 5 minutes.
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

import httpx
import trio

from bench.otlp_sink import running_sink, tracing_table
from bench.processes import PYTHON, free_port, running

READY_TIMEOUT_S = 900.0  # imports under valgrind take minutes on a machine shared with others
SERVED_MODEL = "qwen3-32b"


def gateway_config(listen: str, sim_url: str, tracing: str = "") -> str:
    return f"""{tracing}
[server]
listen = "{listen}"
[auth]
open = true
[usage]
ledger = "none"
[aliases.{SERVED_MODEL}]
[[aliases.{SERVED_MODEL}.providers]]
name = "sim"
type = "openai_compatible"
base_url = "{sim_url}/v1"
model = "{SERVED_MODEL}"
max_inflight = 64
probe = false
"""


async def load(url: str, streams: int, tokens: int) -> int:
    """``streams`` streams at once, each ``tokens`` content tokens; the chunks received."""
    body = {
        "model": SERVED_MODEL,
        "stream": True,
        "max_tokens": tokens,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    received = 0

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal received
        async with client.stream("POST", url, json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                received += line.startswith("data: {")

    async with (
        httpx.AsyncClient(timeout=300, trust_env=False) as client,
        trio.open_nursery() as nursery,
    ):
        for _ in range(streams):
            nursery.start_soon(one, client)
    return received


def instructions(
    work: Path, sim_url: str, streams: int, tokens: int, tracing: str = ""
) -> tuple[int, int]:
    """(instructions of the whole gateway process, chunks relayed) for one run."""
    port = free_port()
    config = work / "gateway.toml"
    config.write_text(gateway_config(f"127.0.0.1:{port}", sim_url, tracing))
    out = work / f"cachegrind-{tokens}.out"
    argv = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        f"--cachegrind-out-file={out}",
        PYTHON,
        "-m",
        "trio_gateway",
        "serve",
        "--config",
        str(config),
        "--log-level",
        "warning",
    ]
    base = f"http://127.0.0.1:{port}"
    with running(
        "gateway",
        argv,
        log_path=work / f"gateway-{tokens}.log",
        ready_url=base + "/healthz",
        ready_timeout_s=READY_TIMEOUT_S,
    ):
        chunks = trio.run(load, base + "/v1/chat/completions", streams, tokens)
    match = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no summary line in {out}")
    return int(match.group(1)), chunks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--short", type=int, default=100, help="tokens per stream, first run")
    parser.add_argument("--long", type=int, default=500, help="tokens per stream, second run")
    parser.add_argument("--tokens-per-s", type=float, default=10.0, help="per stream")
    parser.add_argument("--tracing", type=float, help="[tracing] at this sample ratio")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    sim_port = free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    sim_argv = [
        PYTHON,
        "-m",
        "trio_gateway.sim",
        "--listen",
        f"127.0.0.1:{sim_port}",
        "--max-num-seqs",
        "256",
        "--decode-step-s",
        str(1.0 / args.tokens_per_s),
        "--decode-step-s-per-seq",
        "0",
        "--no-access-log",
    ]
    with tempfile.TemporaryDirectory(prefix="chunk-instructions-") as tmp:
        work = Path(tmp)
        with (
            running("sim", sim_argv, log_path=work / "sim.log", ready_url=sim_url + "/health"),
            running_sink(work) as sink_url,
        ):
            tracing = "" if args.tracing is None else tracing_table(args.tracing, sink_url)
            short = instructions(work, sim_url, args.streams, args.short, tracing)
            long = instructions(work, sim_url, args.streams, args.long, tracing)
    per_chunk = (long[0] - short[0]) / (long[1] - short[1])
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result = {
        "commit": commit,
        "streams": args.streams,
        "tracing": args.tracing,
        "runs": [
            {"tokens": args.short, "instructions": short[0], "chunks": short[1]},
            {"tokens": args.long, "instructions": long[0], "chunks": long[1]},
        ],
        "instructions_per_chunk": round(per_chunk),
    }
    print(json.dumps(result))
    print(f"| {commit} | {per_chunk / 1000:.0f}K instructions per relayed chunk |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
