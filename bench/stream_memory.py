"""Where an open stream's memory goes in the gateway: ``tracemalloc`` snapshots, idle and with
N slow streams open, the difference grouped by where it was allocated, per stream.

Scenario D measures RSS from outside (its target: ≤ 30 KiB per open stream); this says which
objects make it up, so a cut can be aimed. The gateway runs as ``bench.traced_gateway`` (the
gateway with ``tracemalloc`` on, a snapshot written on SIGUSR1); the simulator holds every
stream open (one token a second, slots for all). Traced bytes are Python objects only: RSS adds
the allocator's slack and the kernel's socket buffers on top.

    .venv/bin/python -m bench.stream_memory --streams 1000
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from functools import partial
from pathlib import Path

import trio

from bench import harness
from bench.processes import PYTHON, _stop, _wait_ready, free_port
from bench.procstat import raise_nofile_limit
from bench.rawhttp import StreamResult, stream_chat
from bench.streams import HOST, chat_request

SNAPSHOT_TIMEOUT_S = 30.0
PEAK_TIMEOUT_S = 300.0
HELD_TOKENS = 3000  # at a token a second: open for the whole measurement


def _snapshot(pid: int, path: Path) -> tracemalloc.Snapshot:
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
    done = path.with_suffix(".done")
    while not done.exists():  # another process's file: nothing to wait on but the clock
        if time.monotonic() > deadline:
            raise SystemExit(f"no snapshot from the gateway in {SNAPSHOT_TIMEOUT_S:g} s")
        time.sleep(0.05)
    return tracemalloc.Snapshot.load(str(path))


async def _hold(port: int, streams: int, on_peak: trio.Event, release: trio.Event) -> int:
    started = 0

    def first_token() -> None:
        nonlocal started
        started += 1
        if started == streams:
            on_peak.set()

    results = [StreamResult(index=i) for i in range(streams)]
    async with trio.open_nursery() as nursery:
        for i, result in enumerate(results):
            request = chat_request(port, harness.ALIAS, HELD_TOKENS, f"m{i}")
            held = partial(stream_chat, connect_timeout_s=30.0, on_first_token=first_token)
            nursery.start_soon(held, result, HOST, port, request)
        with trio.move_on_after(PEAK_TIMEOUT_S) as waited:
            await on_peak.wait()
            await release.wait()
        if waited.cancelled_caught:
            errors = Counter(f"{r.error}: {r.detail}"[:200] for r in results if r.error)
            raise SystemExit(f"{started} of {streams} streams started; failures: {errors}")
        nursery.cancel_scope.cancel()
    return started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--group", choices=["lineno", "traceback"], default="lineno")
    a = parser.parse_args(argv)
    raise_nofile_limit()
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as tmp_:
        tmp = Path(tmp_)
        sim_port, port = free_port(), free_port()
        sim = harness.SimSettings(max_num_seqs=a.streams + 10, decode_step_s=1.0)
        gateway = harness.GatewaySettings(max_inflight=a.streams + 10, queue_timeout_s=60.0)
        (tmp / "gateway.toml").write_text(harness.gateway_toml(gateway, port, sim_port))
        # bench.sim_server: the simulator with a listen backlog for a thousand connects at once.
        sim_argv = [PYTHON, "-m", "bench.sim_server", "--abort-log", str(tmp / "aborts.txt")]
        sim_argv += ["--", "--listen", f"127.0.0.1:{sim_port}"]
        frames = "12" if a.group == "traceback" else "1"
        gw_argv = [PYTHON, "-m", "bench.traced_gateway", str(tmp / "snap"), frames, "serve"]
        gw_argv += ["--config", str(tmp / "gateway.toml"), "--log-level", "warning"]
        sim_child = harness._spawn("simulator", [*sim_argv, *sim.flags()], tmp / "sim.log")
        gw_child = harness._spawn("gateway", gw_argv, tmp / "gateway.log")
        try:
            _wait_ready(sim_child, f"http://127.0.0.1:{sim_port}/health", 60.0)
            _wait_ready(gw_child, f"http://127.0.0.1:{port}/healthz", 60.0)
            # A few streams first, so one-time allocations (imports, caches) are in the baseline.
            trio.run(_warm, port)
            before = _snapshot(gw_child.process.pid, tmp / "snap-0")
            peak: dict[str, tracemalloc.Snapshot] = {}

            async def run() -> int:
                on_peak, release = trio.Event(), trio.Event()
                async with trio.open_nursery() as nursery:

                    async def measure() -> None:
                        await on_peak.wait()
                        peak["s"] = await trio.to_thread.run_sync(
                            _snapshot, gw_child.process.pid, tmp / "snap-1"
                        )
                        release.set()

                    nursery.start_soon(measure)
                    return await _hold(port, a.streams, on_peak, release)

            opened = trio.run(run)
        finally:
            _stop(gw_child)
            _stop(sim_child)
    diff = peak["s"].compare_to(before, a.group)
    total = sum(d.size_diff for d in diff)
    print(f"{opened} streams open; traced {total / 1024 / opened:.2f} KiB per stream")
    for d in sorted(diff, key=lambda d: -d.size_diff)[: a.top]:
        lines = d.traceback.format(limit=6 if a.group == "traceback" else 1)
        where = " <- ".join(f.strip() for f in lines if f.strip().startswith("File"))
        print(f"{d.size_diff / opened:8.0f} B/stream {d.count_diff / opened:6.2f} obj  {where}")
    return 0


async def _warm(port: int) -> None:
    async with trio.open_nursery() as nursery:
        for i in range(5):
            request = chat_request(port, harness.ALIAS, 2, f"w{i}")
            warm = partial(stream_chat, connect_timeout_s=30.0)
            nursery.start_soon(warm, StreamResult(i), HOST, port, request)


if __name__ == "__main__":
    sys.exit(main())
