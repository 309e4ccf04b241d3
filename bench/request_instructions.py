"""Instructions the gateway process executes per tiny non-streamed request, counted by valgrind.

Scenario A's question (``bench/overhead.py``: ``max_tokens: 1``, not streamed, thinking off,
``bench/fast_upstream.py`` as the upstream), asked of instruction counts instead of CPU time,
which moves by ±15 % on a shared 2-core machine. The gateway runs as scenario A runs it
(``bench/harness.py``'s config: the default SQLite usage ledger in a temporary directory, log
level info, so one access line a request) under ``valgrind --tool=cachegrind --cache-sim=no``;
the upstream and the load run outside it. Two runs differ only in the requests sent (``-n``, then
three times as many); the difference of their totals over twice ``-n`` is the cost of one
request, with start-up, imports, warm-up and shutdown cancelled out. cachegrind counts every
thread, so the ledger's SQLite writes (in a worker thread) are in; it counts no kernel work, so
the system calls are out. A repeated run agrees to about 0.2 %.

    .venv/bin/python -m bench.request_instructions [-n 300 --connections 8]

``--workers 2`` runs the gateway as ``[server] workers = 2`` and counts every process of it
(the supervisor, with its host broker, and both workers: valgrind's ``--trace-children``), so
the difference to one process is what sharing the limits through the supervisor costs.

To tell what one part costs: ``--log-level warning`` (no access line), ``--ledger none`` (no
SQLite), ``--tracing 1.0`` (the gateway's own spans at that sample ratio, exported to
``bench/otlp_sink.py``, which runs outside valgrind); ``--floor server`` counts the gateway's
HTTP/1.x front alone answering a canned body, ``--floor hypercorn`` hypercorn alone doing the
same, ``--floor upstream`` the front plus the upstream exchange on the gateway's HTTP/1.1
client (``bench/server_floor.py``).

``--stream`` asks the same request as a stream (``"stream": true``, still ``max_tokens: 1``):
a stream's start, with its few chunks (the role chunk, one token, the usage chunk) and its end,
so the difference to the plain request is what a stream costs over an answer in one body.

Needs valgrind (Debian: ``apt-get install valgrind``). About a minute.
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

import attrs
import trio

from bench import harness
from bench.harness import GatewaySettings, gateway_toml
from bench.otlp_sink import running_sink, tracing_table
from bench.processes import PYTHON, free_port, running
from bench.rawhttp import Response, connect, post_bytes

READY_TIMEOUT_S = 900.0  # imports under valgrind take minutes on a machine shared with others
WARMUP_REQUESTS = 20  # the first requests pay for lazy imports: in both runs, so they cancel
# Scenario A's gateway settings (bench/overhead.py).
SETTINGS = GatewaySettings(max_inflight=64, queue_timeout_s=30.0)


def request_bytes(port: int, stream: bool = False) -> bytes:
    """Scenario A's request, byte for byte (bench/overhead.py); ``stream``: the same asked as
    a stream (the upstream's role chunk, one token, the usage chunk, ``[DONE]``)."""
    body: dict[str, object] = {
        "model": harness.ALIAS,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if stream:
        body["stream"] = True
    return post_bytes("127.0.0.1", port, harness.CHAT_PATH, body)


async def load(port: int, requests: int, connections: int, stream: bool = False) -> int:
    """``requests`` requests over ``connections`` keep-alive connections at once; the number
    answered 200 (anything else stops the run: a count of failures is no count of requests)."""
    request = request_bytes(port, stream)
    left = requests
    answered = 0

    async def one() -> None:
        nonlocal left, answered
        stream = await connect("127.0.0.1", port, timeout_s=READY_TIMEOUT_S)
        async with stream:
            while left > 0:
                left -= 1
                await stream.send_all(request)
                response = Response(stream)
                await response.read_head()
                body = await response.read_body()
                if response.status != 200:
                    raise RuntimeError(f"status {response.status}: {body[:300]!r}")
                answered += 1

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(one)
    return answered


def served_argv(args: argparse.Namespace, run: Path, port: int, upstream_port: int) -> list[str]:
    """The process counted: the gateway as scenario A runs it, or a floor."""
    if args.floor != "none":
        argv = [PYTHON, "-m", "bench.server_floor", "--listen", f"127.0.0.1:{port}"]
        if args.floor == "hypercorn":
            argv += ["--server", "hypercorn"]
        if args.floor == "upstream":
            argv += ["--upstream", f"http://127.0.0.1:{upstream_port}/v1"]
        return argv
    settings = SETTINGS
    if args.workers > 1:
        settings = attrs.evolve(settings, server_extra=f"workers = {args.workers}")
    if args.ledger != "default":
        extra = f'{settings.server_extra}\n[usage]\nledger = "{args.ledger}"'
        settings = attrs.evolve(settings, server_extra=extra)
    if args.tracing is not None:
        settings = attrs.evolve(settings, tables=tracing_table(args.tracing, args.sink_url))
    config = run / "gateway.toml"
    config.write_text(gateway_toml(settings, port, upstream_port), encoding="utf-8")
    argv = [PYTHON, "-m", "trio_gateway", "serve", "--config", str(config)]
    return [*argv, "--log-level", args.log_level]


def instructions(args: argparse.Namespace, work: Path, upstream_port: int, requests: int) -> int:
    """The instructions of the whole process counted (every thread) for one run."""
    run = work / f"run-{requests}"
    run.mkdir()
    port = free_port()
    argv = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--trace-children=yes"]
    argv += [f"--cachegrind-out-file={run}/cachegrind.out.%p"]
    argv += served_argv(args, run, port, upstream_port)
    connections = args.connections
    with running(
        "gateway",
        argv,
        log_path=run / "gateway.log",
        ready_url=f"http://127.0.0.1:{port}/healthz",
        ready_timeout_s=READY_TIMEOUT_S,
    ):
        trio.run(load, port, WARMUP_REQUESTS, connections, args.stream)
        answered = trio.run(load, port, requests, connections, args.stream)
    if answered != requests:
        raise RuntimeError(f"{answered} of {requests} requests answered")
    total = 0
    for out in run.glob("cachegrind.out.*"):
        match = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no summary line in {out}")
        total += int(match.group(1))
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=300, help="requests of the first run")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive, at once")
    parser.add_argument("--log-level", default="info", help="the gateway's --log-level")
    parser.add_argument("--ledger", default="default", help='[usage] ledger, e.g. "none"')
    parser.add_argument("--workers", type=int, default=1, help="[server] workers")
    parser.add_argument(
        "--floor", choices=("none", "server", "hypercorn", "upstream"), default="none"
    )
    parser.add_argument("--tracing", type=float, help="[tracing] at this sample ratio")
    parser.add_argument("--stream", action="store_true", help="ask for a stream (a start)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    upstream_port = free_port()
    upstream_argv = [PYTHON, "-m", "bench.fast_upstream", "--listen", f"127.0.0.1:{upstream_port}"]
    with tempfile.TemporaryDirectory(prefix="request-instructions-") as tmp:
        work = Path(tmp)
        with (
            running(
                "fast upstream",
                upstream_argv,
                log_path=work / "upstream.log",
                ready_url=f"http://127.0.0.1:{upstream_port}/health",
            ),
            running_sink(work) as args.sink_url,
        ):
            short = instructions(args, work, upstream_port, args.n)
            long = instructions(args, work, upstream_port, 3 * args.n)
    per_request = (long - short) / (2 * args.n)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result = {
        "commit": commit,
        "connections": args.connections,
        "log_level": args.log_level,
        "ledger": args.ledger,
        "floor": args.floor,
        "tracing": args.tracing,
        "workers": args.workers,
        "stream": args.stream,
        "runs": [
            {"requests": args.n, "instructions": short},
            {"requests": 3 * args.n, "instructions": long},
        ],
        "instructions_per_request": round(per_request),
    }
    print(json.dumps(result))
    print(f"| {commit} | {per_request / 1e6:.3f}M instructions per request |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
