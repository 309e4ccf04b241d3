"""Where the gateway's CPU goes per tiny non-streamed request: py-spy on the gateway process.

Scenario A's load (``bench/overhead.py``: ``max_tokens: 1``, not streamed, ``--connections``
keep-alive clients, ``bench/fast_upstream.py`` as the upstream) against the gateway as scenario
A runs it (the config and counts of ``bench/request_instructions.py``); py-spy samples the
gateway for the whole load and the inclusive share of each function is printed, largest first.
Shares, not times: they hold on a shared machine where CPU time does not.

    .venv/bin/python -m bench.profile_requests [--connections 50 --duration-s 15 --top 80]

Needs py-spy (the ``bench`` extra). About 20 s.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import trio

from bench.harness import gateway_toml
from bench.processes import PYTHON, free_port, running
from bench.profile_chunks import inclusive_shares
from bench.rawhttp import Response, connect
from bench.request_instructions import SETTINGS, WARMUP_REQUESTS, load, request_bytes


async def load_for(port: int, connections: int, duration_s: float) -> int:
    """Requests answered by ``connections`` keep-alive clients in ``duration_s``."""
    request = request_bytes(port)
    answered = 0
    deadline = trio.current_time() + duration_s

    async def one() -> None:
        nonlocal answered
        async with await connect("127.0.0.1", port, timeout_s=10.0) as stream:
            while trio.current_time() < deadline:
                await stream.send_all(request)
                response = Response(stream)
                await response.read_head()
                await response.read_body()
                answered += response.status == 200

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(one)
    return answered


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--rate-hz", type=int, default=250, help="py-spy's sampling rate")
    parser.add_argument("--top", type=int, default=80)
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw output here")
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(PYTHON).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("py-spy is not installed (pip install '.[bench]')", file=sys.stderr)
        return 2
    upstream_port, port = free_port(), free_port()
    upstream_argv = [PYTHON, "-m", "bench.fast_upstream", "--listen", f"127.0.0.1:{upstream_port}"]
    with tempfile.TemporaryDirectory(prefix="profile-requests-") as tmp:
        work = Path(tmp)
        config = work / "gateway.toml"
        config.write_text(gateway_toml(SETTINGS, port, upstream_port), encoding="utf-8")
        gateway_argv = [PYTHON, "-m", "trio_gateway", "serve", "--config", str(config)]
        gateway_argv += ["--log-level", "info"]
        out = work / "profile.txt"
        with (
            running(
                "fast upstream",
                upstream_argv,
                log_path=work / "upstream.log",
                ready_url=f"http://127.0.0.1:{upstream_port}/health",
            ),
            running(
                "gateway",
                gateway_argv,
                log_path=work / "gateway.log",
                ready_url=f"http://127.0.0.1:{port}/healthz",
            ) as gateway,
        ):
            trio.run(load, port, WARMUP_REQUESTS, 4)
            # Not --nonblocking: read while the process runs, a third of the stacks came out cut
            # short (rooted at a coroutine, not at main). Stopped for each sample, the gateway
            # serves about half as fast; the shares are what is read here.
            spy_argv = [py_spy, "record", "-f", "raw", "-o", str(out)]
            spy_argv += ["-r", str(args.rate_hz), "-p", str(gateway.process.pid)]
            spy = subprocess.Popen(spy_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1.0)  # py-spy attaches
            started = time.monotonic()
            answered = trio.run(load_for, port, args.connections, args.duration_s)
            elapsed_s = time.monotonic() - started
            spy.send_signal(2)  # SIGINT: py-spy writes what it has and exits
            spy.wait(timeout=30)
        raw = out.read_text()
        if args.raw is not None:
            args.raw.write_text(raw)
        samples, shares = inclusive_shares(raw)
    print(f"{answered} requests in {elapsed_s:.1f} s; {samples} samples of the gateway")
    for key, share in shares[: args.top]:
        print(f"{100 * share:5.1f} %  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
