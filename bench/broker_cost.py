"""What sharing a host's limits between workers costs per admission, option by option
(issue 43 item 1; docs/deployment.md, "Several processes on one host").

Each option takes a free slot and gives it back ``-n`` times in a row, as a request that finds
its provider's gate open does:

- ``local``: one process's own gate (``LocalGate``: take and release, no schedule point), the
  cost a single process pays today;
- ``broker``: the workers' gate (``HostGate``): one round trip to the host broker over a Unix
  socketpair for the take, one write for the release. The broker (``process/host_broker.py``)
  runs in a second process, as the supervisor does, and is counted with it: what the host pays;
- ``broker-admit``: the same round trip for a keyed request's budget and rate limits
  (``HostStore.admit``, ``LIMITS_ADMIT``) plus the settlement's write;
- ``shm``: a counter in shared memory under a process-shared lock (``multiprocessing.Lock``, a
  POSIX semaphore): the fast path of the shared-memory design, which has no way to wait for a
  slot across processes (that needs a wake-up from whoever releases: a broker again, or
  polling) nor to take back a dead worker's slots (that needs an owner per slot and a sweeper).

Batches of leases handed out ahead are the ``broker`` round trip shared by ``k`` takes plus a
``local`` take each: ``broker / k + local``, printed for k = 8. They give up the exact limit
(a slot handed to one worker ahead of time is idle while another's request waits for it).

Counted by valgrind (instructions, every process of the run: ``--trace-children=yes``), as
two runs of ``-n`` and ``3n`` whose difference cancels start-up; and timed (µs per admission,
the best of three rounds, which on a shared machine says little). Needs valgrind.

    .venv/bin/python -m bench.broker_cost [-n 2000] [--modes local,broker,broker-admit,shm]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import trio

from trio_gateway.accounting.host_store import HostStore
from trio_gateway.accounting.limit_store import AdmitArgs, MemoryStore
from trio_gateway.capacity.gate import LocalGate
from trio_gateway.capacity.host_gate import HostGates
from trio_gateway.capacity.host_link import HostLink
from trio_gateway.capacity.slot_queue import NO_RESERVATION
from trio_gateway.process.host_broker import HostBroker

MODES = ("local", "broker", "broker-admit", "shm")
MAX_INFLIGHT = 64
BATCH = 8


async def serve_broker(fd: int) -> None:
    """The supervisor's side, in its own process: a broker serving one worker's end."""
    broker = HostBroker(MemoryStore())
    await broker.serve_worker(socket.socket(fileno=fd))


async def admissions(mode: str, n: int, sock: socket.socket | None) -> float:
    """``n`` admissions of ``mode``; seconds they took."""
    if mode == "local":
        gate = LocalGate(MAX_INFLIGHT)
        started = time.perf_counter()
        for _ in range(n):
            gate.try_acquire_nowait("b")
            gate.release_nowait("b")
        return time.perf_counter() - started
    assert sock is not None
    link = HostLink(sock)
    async with trio.open_nursery() as nursery:
        await nursery.start(link.serve)
        host_gate = HostGates(link).gate("vllm", MAX_INFLIGHT, NO_RESERVATION)
        store = HostStore(link)
        started = time.perf_counter()
        for i in range(n):
            if mode == "broker":
                assert await host_gate.try_acquire("b")
                host_gate.release_nowait("b")  # as the router gives a slot back
            else:
                args = AdmitArgs(
                    key="k", rpm=None, tpm=None, tokens=1, budget=10**15, hold=1,
                    hold_id=f"h{i}", ttl_s=60.0,
                )  # fmt: skip
                result = await store.admit(args)
                assert result.refused is None
                await store.settle("k", args.hold_id, 1)
        took = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    return took


def shm_admissions(n: int) -> float:
    lock = multiprocessing.Lock()
    count: Synchronized[int] = multiprocessing.Value("i", 0, lock=False)
    started = time.perf_counter()
    for _ in range(n):
        with lock:
            if count.value < MAX_INFLIGHT:
                count.value += 1
        with lock:
            count.value -= 1
    return time.perf_counter() - started


def run_one(mode: str, n: int) -> float:
    """This process's part of one run: the admissions (and the broker's process, started)."""
    if mode == "shm":
        return shm_admissions(n)
    if mode == "local":
        return trio.run(admissions, mode, n, None)
    ours, theirs = socket.socketpair()
    argv = [sys.executable, "-m", "bench.broker_cost", "--serve-fd", str(theirs.fileno())]
    broker = subprocess.Popen(argv, pass_fds=(theirs.fileno(),))
    theirs.close()
    try:
        return trio.run(admissions, mode, n, ours)
    finally:
        ours.close()
        broker.wait(30)


def counted(mode: str, n: int, work: Path) -> int:
    """Instructions of every process of a run of ``n`` admissions."""
    out = work / f"{mode}-{n}"
    out.mkdir()
    argv = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--trace-children=yes"]
    argv += [f"--cachegrind-out-file={out}/cg.%p", sys.executable, "-m", "bench.broker_cost"]
    argv += ["--child", mode, "-n", str(n)]
    subprocess.run(argv, check=True, capture_output=True)
    total = 0
    for path in out.iterdir():
        match = re.search(r"^summary:\s+(\d+)", path.read_text(), re.MULTILINE)
        if match is not None:
            total += int(match.group(1))
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=2000, help="admissions of the first run")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--serve-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_fd is not None:
        trio.run(serve_broker, args.serve_fd)
        return 0
    if args.child is not None:
        run_one(args.child, args.n)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="broker-cost-") as tmp:
        for mode in modes:
            short = counted(mode, args.n, Path(tmp))
            long = counted(mode, 3 * args.n, Path(tmp))
            micros = min(run_one(mode, args.n) for _ in range(3)) / args.n * 1e6
            results[mode] = {
                "instructions": round((long - short) / (2 * args.n)),
                "microseconds": round(micros, 2),
            }
    print(json.dumps({"n": args.n, "results": results}))
    print("| option | instructions per admission | µs per admission (timed) |")
    print("| --- | --- | --- |")
    for mode, r in results.items():
        print(f"| {mode} | {r['instructions']:,.0f} | {r['microseconds']} |")
    if "broker" in results and "local" in results:
        batched = results["broker"]["instructions"] / BATCH + results["local"]["instructions"]
        print(f"| batches of {BATCH} leases (computed) | {batched:,.0f} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
