"""The floor under the gateway's CPU per relayed chunk: bytes moved by trio, nothing else.

Scenario B's shape without HTTP, SSE or JSON: a feeder process writes a vLLM-sized chunk (the
fixture's bytes, 330) to each of ``--streams`` TCP connections at once, ``--tokens-per-s``
times a second (as the simulator's engine steps every sequence together), and drains the
connections on the far side. Between them a relay process moves each chunk from its upstream
connection to its client connection with one ``os.read`` and one ``os.write``, in one of two
ways:

- ``task``: a trio task per stream waiting with ``trio.lowlevel.wait_readable``, as the
  gateway's upstream reads do (``http1/client.H1Response.receive``): one epoll registration,
  one wake-up and one task step per chunk;
- ``epoll``: one trio task and an epoll set of its own (edge-triggered, each socket registered
  once) that reads and writes every ready stream in turn, as nginx's worker does: no task
  switch per chunk.

The relay's user and system CPU per chunk come from ``/proc``. The gateway can spend no less
than ``task`` per chunk while each stream's reads wake its own task; what it spends above that
is its own work (parse, translate, account); ``epoll`` is what a relay without that wake-up
would cost (docs/benchmarks.md, "What stands between the gateway and nginx per chunk").

    .venv/bin/python -m bench.trio_floor [--streams 100 --tokens-per-s 50 --seconds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import trio

CHUNK = (
    b'data: {"id":"chatcmpl-a7013ea28c80d9a5","object":"chat.completion.chunk",'
    b'"created":1795960731,"model":"qwen3-32b","choices":[{"index":0,"delta":'
    b'{"content":" rain"},"logprobs":null,"finish_reason":null,"token_ids":null}],'
    b'"usage":{"prompt_tokens":23,"total_tokens":25,"completion_tokens":2,'
    b'"completion_tokens_details":{"reasoning_tokens":0}}}\n\n'
)
READ_BYTES = 65536
WAYS = ("task", "park", "epoll")


def feed(streams: int, tokens_per_s: float, seconds: float) -> None:
    """Listen on two ports (printed), take ``streams`` connections on each, write a chunk to
    every upstream one per step, drain the client ones; print chunks sent and received."""
    up = socket.create_server(("127.0.0.1", 0), backlog=streams + 16)
    down = socket.create_server(("127.0.0.1", 0), backlog=streams + 16)
    print(up.getsockname()[1], down.getsockname()[1], flush=True)
    ups = [up.accept()[0] for _ in range(streams)]
    downs = [down.accept()[0] for _ in range(streams)]
    poll = select.epoll()
    for conn in downs:
        conn.setblocking(False)
        poll.register(conn.fileno(), select.EPOLLIN)
    step_s = 1.0 / tokens_per_s
    next_step = time.monotonic()
    end = next_step + seconds
    sent = received = 0
    while (now := time.monotonic()) < end:
        if now >= next_step:
            for conn in ups:
                conn.sendall(CHUNK)
            sent += streams
            next_step += step_s
        for fd, _ in poll.poll(max(0.0, next_step - time.monotonic())):
            with contextlib.suppress(BlockingIOError):
                received += len(os.read(fd, READ_BYTES))
    print(sent, received // len(CHUNK), flush=True)
    for conn in ups:
        conn.close()


async def _task_pipe(src: trio.socket.SocketType, dst: trio.socket.SocketType) -> None:
    src_fd, dst_fd = src.fileno(), dst.fileno()
    while True:
        await trio.lowlevel.wait_readable(src)
        data = os.read(src_fd, READ_BYTES)
        if not data:
            return
        os.write(dst_fd, data)


async def _epoll_pipes(pairs: list[tuple[trio.socket.SocketType, trio.socket.SocketType]]) -> None:
    poll = select.epoll()
    peer: dict[int, int] = {}
    for src, dst in pairs:
        poll.register(src.fileno(), select.EPOLLIN | select.EPOLLET)
        peer[src.fileno()] = dst.fileno()
    while peer:
        await trio.lowlevel.wait_readable(poll.fileno())
        for fd, _ in poll.poll(0):
            while True:  # edge-triggered: read until the socket is empty
                try:
                    data = os.read(fd, READ_BYTES)
                except BlockingIOError:
                    break
                if not data:  # the feeder is done: this stream is over
                    poll.unregister(fd)
                    del peer[fd]
                    break
                os.write(peer[fd], data)
                if len(data) < READ_BYTES:
                    break


class _Parked:
    """Each stream's task parks; one pump task with an edge-triggered epoll set (each socket
    registered once) wakes the task whose socket became readable: a task switch per chunk as
    with ``task``, but no epoll registration per wait."""

    def __init__(self) -> None:
        self.poll = select.epoll()
        self.waiting: dict[int, trio.lowlevel.Task] = {}
        self.ready: set[int] = set()

    async def wait(self, fd: int) -> None:
        if fd in self.ready:
            self.ready.discard(fd)
            return
        self.waiting[fd] = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    async def pump(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self.poll.fileno())
            for fd, _ in self.poll.poll(0):
                task = self.waiting.pop(fd, None)
                if task is None:
                    self.ready.add(fd)
                else:
                    trio.lowlevel.reschedule(task)


async def _parked_pipe(parked: _Parked, src: trio.socket.SocketType, dst: int) -> None:
    fd = src.fileno()
    parked.poll.register(fd, select.EPOLLIN | select.EPOLLET)
    while True:
        await parked.wait(fd)
        while True:
            try:
                data = os.read(fd, READ_BYTES)
            except BlockingIOError:
                break
            if not data:
                return
            os.write(dst, data)
            if len(data) < READ_BYTES:
                break


def relay(way: str, streams: int, up_port: int, down_port: int) -> None:
    async def main() -> None:
        ups: list[trio.socket.SocketType] = []
        downs: list[trio.socket.SocketType] = []
        for port, conns in ((up_port, ups), (down_port, downs)):
            for _ in range(streams):
                conn = trio.socket.socket()
                await conn.connect(("127.0.0.1", port))
                conns.append(conn)
        if way == "epoll":
            await _epoll_pipes(list(zip(ups, downs, strict=True)))
            return
        async with trio.open_nursery() as nursery:
            if way == "park":
                parked = _Parked()
                nursery.start_soon(parked.pump)
                for src, dst in zip(ups, downs, strict=True):
                    nursery.start_soon(_parked_pipe, parked, src, dst.fileno())
                return
            for src, dst in zip(ups, downs, strict=True):
                nursery.start_soon(_task_pipe, src, dst)

    trio.run(main)


def _cpu_s(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def measure(way: str, streams: int, tokens_per_s: float, seconds: float) -> dict[str, float]:
    """One run of ``way``: the relay's CPU per chunk, user and system."""
    me = [sys.executable, "-m", "bench.trio_floor"]
    size = ["--streams", str(streams)]
    feeder = subprocess.Popen(
        [*me, "--feed", *size, "--tokens-per-s", str(tokens_per_s), "--seconds", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert feeder.stdout is not None
    up_port, down_port = feeder.stdout.readline().split()
    relayer = subprocess.Popen([*me, "--relay", way, *size, "--ports", up_port, down_port])
    try:
        sent, received = (int(v) for v in feeder.stdout.readline().split())
        user_s, sys_s = _cpu_s(relayer.pid)
    finally:
        relayer.kill()
        relayer.wait()
        feeder.wait()
    return {
        "sent": sent,
        "relayed": received,
        "user_us": 1e6 * user_s / max(received, 1),
        "sys_us": 1e6 * sys_s / max(received, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.trio_floor", description=__doc__)
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--tokens-per-s", type=float, default=50.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2, help="each way this many times, alternated")
    p.add_argument("--feed", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--relay", choices=WAYS, help=argparse.SUPPRESS)
    p.add_argument("--ports", type=int, nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.feed:
        feed(a.streams, a.tokens_per_s, a.seconds)
        return 0
    if a.relay:
        relay(a.relay, a.streams, *a.ports)
        return 0
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| relay | chunks relayed / sent | user µs/chunk | system µs/chunk | total |")
    print("| --- | --- | --- | --- | --- |")
    for _ in range(a.rounds):
        for way in WAYS:
            r = measure(way, a.streams, a.tokens_per_s, a.seconds)
            total = r["user_us"] + r["sys_us"]
            print(
                f"| {way} | {r['relayed']:,.0f} / {r['sent']:,.0f} | {r['user_us']:.1f} "
                f"| {r['sys_us']:.1f} | {total:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
