"""What leasing ``max_inflight`` in Redis (gate.py) adds to a request: N acquire+release cycles
through a SharedGate against a redis-server this script starts on a free port, next to the same
cycles through a LocalGate (a trio.CapacityLimiter). Uncontended: the limit is above the
concurrency, so every acquire is granted at its first script.

    .venv/bin/python bench/lease_cost.py [--requests 2000] [--concurrency 1]

Round trips are the broker's count of scripts (acquire, release, and the renewal heartbeats of
its ``serve`` during the run); the first call of each script after Redis started also loads it
(NOSCRIPT, SCRIPT LOAD), which the warm-up cycle does before anything is measured.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from bench.processes import free_port
from trio_gateway.capacity.gate import LeaseBroker, LocalGate, SharedGate
from trio_gateway.redis.client import RedisError, open_redis

START_TIMEOUT_S = 10.0


@contextmanager
def redis_server() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


async def wait_ready(url: str) -> None:
    async with open_redis(url) as client:
        with trio.fail_after(START_TIMEOUT_S):
            while True:
                try:
                    await client.ping()
                    return
                except RedisError:
                    await trio.sleep(0.02)


async def cycles(gate: LocalGate | SharedGate, requests: int, concurrency: int) -> list[float]:
    """Seconds of each acquire+release, ``concurrency`` tasks sharing ``requests`` cycles."""
    durations: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            me = object()
            started = time.perf_counter()
            await gate.acquire(me)
            await gate.release(me)
            durations.append(time.perf_counter() - started)

    async with trio.open_nursery() as nursery:
        for i in range(concurrency):
            nursery.start_soon(worker, requests // concurrency + (i < requests % concurrency))
    return durations


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def run(requests: int, concurrency: int, lease_ttl_s: float) -> None:
    limit = max(8, concurrency)
    with redis_server() as url:
        await wait_ready(url)
        async with open_redis(url) as client:
            broker = LeaseBroker(
                client,
                key_prefix="bench:",
                lease_ttl_s=lease_ttl_s,
                timeout_s=1.0,
                on_error="refuse",
            )
            gate = broker.gate("bench", limit)
            await cycles(gate, 1, 1)  # loads the scripts
            async with trio.open_nursery() as nursery:
                await nursery.start(broker.serve)
                round_trips = broker.round_trips
                shared = await cycles(gate, requests, concurrency)
                round_trips = broker.round_trips - round_trips
                nursery.cancel_scope.cancel()
    local = await cycles(LocalGate(limit), requests, concurrency)

    print(f"{requests} acquire+release cycles, concurrency {concurrency}, limit {limit}")
    print(f"{'':14}{'p50 ms':>10}{'p99 ms':>10}")
    for name, values in (("local gate", local), ("shared gate", shared)):
        p50, p99 = (percentile(values, q) * 1000 for q in (0.5, 0.99))
        print(f"{name:14}{p50:10.3f}{p99:10.3f}")
    added = [(percentile(shared, q) - percentile(local, q)) * 1000 for q in (0.5, 0.99)]
    print(f"{'added':14}{added[0]:10.3f}{added[1]:10.3f}")
    print(
        f"redis round trips per request: {round_trips / requests:.3f} "
        f"({round_trips} in all, renewals included); errors: {broker.errors}, "
        f"lost leases: {broker.lost_leases}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--lease-ttl-s", type=float, default=3.0)
    args = parser.parse_args()
    if args.requests < 1 or args.concurrency < 1:
        parser.error("--requests and --concurrency must be >= 1")
    trio.run(run, args.requests, args.concurrency, args.lease_ttl_s)


if __name__ == "__main__":
    main()
