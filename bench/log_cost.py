"""What the access line costs per request (issue 31): before, a ``logging.StreamHandler``
formatting and writing each line on the event loop's thread, as the gateway's logging did;
after, ``log_queue``: the loop captures and queues the record, the writer thread formats and
writes it.

    .venv/bin/python -m bench.log_cost handler [--requests 20000] [--rate 5000] [--rounds 3]
        [--format text|json]
    .venv/bin/python -m bench.log_cost gateway [--src DIR ...] [--requests 20000] [--rounds 3]
    .venv/bin/python -m bench.log_cost gateway --callgrind [--src DIR ...] [--requests 800]

``handler``: one ``trio.run`` per run whose task writes ``--requests`` access lines
(``log_access``, in the request's context) at ``--rate`` lines a second, through the CLI's
handler before (``stream``) or after (``queue``), to a pipe drained by ``cat > /dev/null`` (a
log reader that keeps up). Measured: the loop thread's CPU (``time.thread_time``) and the
process's (``time.process_time``: the writer thread's included, its queue written out), less
that of a run with the access logger off, per line.

``gateway``: the real ``trio-gateway serve`` (from each ``--src``, e.g. an older commit's ``src``
taken with ``git archive``, or ``installed``: the default), stderr into a pipe drained by
``cat``, loaded with ``GET /v1/models`` over 8 keep-alive connections as fast as it answers (the
cheapest request that writes an access line, so logging's share is largest), once with
``--log-level info`` and once with ``warning`` (no access lines), after 200 requests of
warm-up. Measured from /proc: the main thread's CPU (the event loop's; ``schedstat``, ns) and
the process's, info less warning, per request. CPU time moves by ±10 µs a request on a shared
2-core machine; ``--callgrind`` counts instructions instead (valgrind's callgrind, each thread
apart, zeroed after the warm-up and dumped after the load; user space only: a system call's
kernel work is not in it), which a repeated run reproduces to about 0.2 %.

The modes (and sources) alternate, ``--rounds`` times; each round's run is set against the
baseline run next to it, and the median of those differences is printed.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import trio

from bench.processes import quiet_ports
from bench.procstat import cpu_seconds
from bench.rawhttp import RequestFailed, Response, connect
from trio_gateway.ops.access import (
    JsonFormatter,
    RequestContext,
    RequestIdFilter,
    TextFormatter,
    access_log,
    log_access,
    request_context,
)
from trio_gateway.ops.log_queue import DroppedRecords, LogQueue
from trio_gateway.ops.tracing import new_trace

PACE_EVERY = 16  # lines between two sleeps of the paced writer
CONNECTIONS = 8
WARMUP_REQUESTS = 200  # the first requests pay for lazy imports
# Imports under valgrind take a minute or more on a busy machine, and each request ~50x longer.
READY_TIMEOUT_S = {False: 30.0, True: 300.0}
ANSWER_TIMEOUT_S = {False: 10.0, True: 120.0}
INSTALLED = "installed"


@attrs.frozen
class Run:
    """One run's cost: seconds of CPU, or (``--callgrind``) instructions."""

    loop: float  # the event loop's thread
    process: float  # every thread
    dropped: int | None = None  # the handler's; the gateway's are not read


@contextmanager
def _drained_pipe() -> Iterator[int]:
    """The write end of a pipe that ``cat`` reads into /dev/null."""
    read_end, write_end = os.pipe()
    reader = subprocess.Popen(["cat"], stdin=read_end, stdout=subprocess.DEVNULL)
    os.close(read_end)
    try:
        yield write_end
    finally:
        os.close(write_end)
        reader.wait()


# --- handler: the handler alone, in this process ------------------------------------------------


def _context(index: int) -> RequestContext:
    context = RequestContext(
        request_id=f"{index:024x}", route="POST /v1/chat/completions", trace=new_trace()
    )
    context.status, context.outcome, context.alias = 200, "completed", "agent-lite"
    context.provider, context.key, context.ttft_s = "vllm-local", "search-agent", 0.0417
    context.prompt_tokens, context.completion_tokens = 12, 64
    return context


async def _log_lines(contexts: list[RequestContext], rate: float) -> float:
    """The loop thread's CPU seconds to log one access line per context, at ``rate`` a second."""
    cpu = time.thread_time()
    start = trio.current_time()
    for index, context in enumerate(contexts):
        with request_context(context):
            log_access(context, 0.612)
        if index % PACE_EVERY == 0:
            await trio.sleep_until(start + index / rate)
    return time.thread_time() - cpu


def handler_run(
    mode: str, contexts: list[RequestContext], formatter: logging.Formatter, rate: float
) -> Run:
    dropped = DroppedRecords()
    with _drained_pipe() as fd:
        finish: Callable[[], object]
        if mode == "queue":
            logs = LogQueue(fd, formatter, dropped=dropped)
            logs.start()
            handler: logging.Handler = logs.handler
            finish = logs.close
        else:
            # The CLI's logging before issue 31: stderr is line-buffered, one write per line.
            stream = open(fd, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
            handler = logging.StreamHandler(stream)
            handler.setFormatter(formatter)
            finish = stream.flush
        handler.addFilter(RequestIdFilter())
        access_log.handlers[:] = [handler]
        access_log.propagate = False
        access_log.setLevel(logging.WARNING if mode == "off" else logging.INFO)
        process = time.process_time()
        loop = trio.run(_log_lines, contexts, rate)
        finish()
        process = time.process_time() - process
        access_log.handlers[:] = []
    return Run(loop, process, dropped.total())


def handler_main(args: argparse.Namespace) -> None:
    formatter = JsonFormatter() if args.format == "json" else TextFormatter()
    contexts = [_context(index) for index in range(args.requests)]
    modes = ("off", "stream", "queue")
    runs: dict[str, list[Run]] = {mode: [] for mode in modes}
    handler_run("queue", contexts[:1000], formatter, args.rate)  # warm-up
    for _ in range(args.rounds):
        for mode in modes:
            runs[mode].append(handler_run(mode, contexts, formatter, args.rate))
    print(
        f"{args.requests} access lines ({args.format}) at {args.rate:g}/s, median of"
        f" {args.rounds} rounds: CPU per line, less the logger-off run's"
    )
    _table(runs, "off", ("stream", "queue"), args.requests, unit="µs", scale=1e6)


# --- gateway: the real trio-gateway serve --------------------------------------------------------

GATEWAY_TOML = """
[server]
listen = "127.0.0.1:{port}"

[usage]
sink = "none"

[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "unused"
type = "openai_compatible"
base_url = "http://127.0.0.1:9/v1"
model = "m"
probe = false
"""


def _loop_thread_cpu_s(pid: int) -> float:
    """The main thread's CPU (the event loop's), in ns from schedstat."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


async def _load(port: int, requests: int, timeout_s: float) -> None:
    request = f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()

    async def one_connection(count: int) -> None:
        stream = await connect("127.0.0.1", port, timeout_s=timeout_s)
        async with stream:
            for _ in range(count):
                with trio.fail_after(timeout_s):
                    await stream.send_all(request)
                    response = Response(stream)
                    await response.read_head()
                    await response.read_body()
                assert response.status == 200, response.status

    async with trio.open_nursery() as nursery:
        for _ in range(CONNECTIONS):
            nursery.start_soon(one_connection, requests // CONNECTIONS)


async def _wait_ready(port: int, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    with trio.fail_after(timeout_s):
        while True:
            assert process.poll() is None, "the gateway exited"
            try:
                stream = await connect("127.0.0.1", port, timeout_s=1.0)
            except RequestFailed:  # not listening yet
                await trio.sleep(0.05)
                continue
            await stream.aclose()
            return


def _callgrind_threads(out: Path) -> list[int]:
    """Instructions per thread in callgrind's first dump (``FILE.1-TT``, one per thread)."""
    counts = []
    for path in sorted(out.glob("cg.*.1-*")):
        match = re.search(r"^summary: (\d+)$", path.read_text(errors="replace"), re.M)
        assert match is not None, path
        counts.append(int(match.group(1)))
    return counts


def gateway_run(level: str, src: str | None, requests: int, workdir: Path, callgrind: bool) -> Run:
    (port,) = quiet_ports(1)
    config = workdir / "gateway.toml"
    config.write_text(GATEWAY_TOML.format(port=port))
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    command = [sys.executable, "-m", "trio_gateway", "serve", "--config", str(config)]
    out = workdir / "callgrind"
    if callgrind:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        command = [
            "valgrind",
            "--tool=callgrind",
            "--separate-threads=yes",
            f"--callgrind-out-file={out}/cg.%p",
            *command,
        ]
    timeout_s = ANSWER_TIMEOUT_S[callgrind]
    with _drained_pipe() as fd:
        process = subprocess.Popen(
            [*command, "--log-level", level], stdout=subprocess.DEVNULL, stderr=fd, env=env
        )
        try:
            trio.run(_wait_ready, port, process, READY_TIMEOUT_S[callgrind])
            trio.run(_load, port, WARMUP_REQUESTS, timeout_s)
            if callgrind:
                subprocess.run(
                    ["callgrind_control", "-z", str(process.pid)], check=True, capture_output=True
                )
                trio.run(_load, port, requests, timeout_s)
                subprocess.run(
                    ["callgrind_control", "-d", str(process.pid)], check=True, capture_output=True
                )
                threads = _callgrind_threads(out)
                return Run(threads[0], sum(threads))
            loop, total = _loop_thread_cpu_s(process.pid), cpu_seconds(process.pid)
            trio.run(_load, port, requests, timeout_s)
            loop = _loop_thread_cpu_s(process.pid) - loop
            after = cpu_seconds(process.pid)
            assert total is not None and after is not None
            return Run(loop, after - total)
        finally:
            process.terminate()
            process.wait()


def gateway_main(args: argparse.Namespace) -> None:
    if args.callgrind and shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"log-cost-{os.getpid()}"
    workdir.mkdir(exist_ok=True)
    requests = args.requests or (800 if args.callgrind else 20_000)
    sources = args.src or [INSTALLED]
    runs: dict[str, dict[str, list[Run]]] = {s: {"warning": [], "info": []} for s in sources}
    for _ in range(args.rounds):
        for source in sources:
            src = None if source == INSTALLED else source
            for level, level_runs in runs[source].items():
                level_runs.append(gateway_run(level, src, requests, workdir, args.callgrind))
    what = "instructions (callgrind)" if args.callgrind else "CPU"
    print(
        f"the gateway, {requests} GET /v1/models over {CONNECTIONS} connections, median of"
        f" {args.rounds} rounds: {what} per request at --log-level info (an access line each),"
        " less warning's in the same round"
    )
    for source in sources:
        print(f"source: {source}")
        if args.callgrind:
            _table(runs[source], "warning", ("info",), requests, unit="K instr", scale=1e-3)
        else:
            _table(runs[source], "warning", ("info",), requests, unit="µs", scale=1e6)


def _table(
    runs: dict[str, list[Run]],
    baseline: str,
    modes: tuple[str, ...],
    count: int,
    *,
    unit: str,
    scale: float,
) -> None:
    """Medians of each round's difference from the baseline run next to it in time (the
    machine's load drifts between rounds)."""
    base = runs[baseline]
    per = scale / count
    loop_head, process_head = f"loop thread {unit}", f"process {unit}"
    print(f"{'':<8} {loop_head:>18} {process_head:>16} {'dropped':>8}")
    base_loop = statistics.median(r.loop for r in base) * per
    base_process = statistics.median(r.process for r in base) * per
    print(f"{baseline:<8} {base_loop:>18.1f} {base_process:>16.1f} {'':>8}")
    for mode in modes:
        pairs = list(zip(runs[mode], base, strict=True))
        loop = statistics.median(r.loop - b.loop for r, b in pairs) * per
        process = statistics.median(r.process - b.process for r, b in pairs) * per
        counts = [r.dropped for r in runs[mode] if r.dropped is not None]
        dropped = str(max(counts)) if counts else "-"
        print(f"{mode:<8} {loop:>+18.1f} {process:>+16.1f} {dropped:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    handler = commands.add_parser("handler", help="the handler alone, in this process")
    handler.add_argument("--requests", type=int, default=20_000)
    handler.add_argument("--rate", type=float, default=5_000.0, help="lines a second")
    handler.add_argument("--rounds", type=int, default=3)
    handler.add_argument("--format", choices=("text", "json"), default="text")
    gateway = commands.add_parser("gateway", help="the real trio-gateway serve")
    gateway.add_argument(
        "--src",
        action="append",
        help=f"serve this source tree (PYTHONPATH; {INSTALLED!r}: the installed package);"
        " several alternate in each round",
    )
    gateway.add_argument("--requests", type=int, help="default: 20000, or 800 with --callgrind")
    gateway.add_argument("--rounds", type=int, default=3)
    gateway.add_argument(
        "--callgrind", action="store_true", help="count instructions under valgrind"
    )
    args = parser.parse_args()
    if args.command == "handler":
        handler_main(args)
    else:
        gateway_main(args)


if __name__ == "__main__":
    main()
