"""A stuck log reader never stops the gateway (issue 31), on the real ``trio-gateway serve``.

Its stderr goes into a pipe nobody reads: the pipe's 64 KiB fill after a few hundred lines,
then the log's queue, then records are dropped. Every request and stream is still answered on
time and ``/healthz`` answers throughout. Then the pipe is read: the gateway writes what it had
queued and one line saying how many records it dropped, the number ``/metrics`` counted.

A gateway whose reader stays stuck still exits on SIGTERM: the log's flush at exit gives up
after its deadline.

On the code before the queue, the gateway froze at the first write into the full pipe: the
first ``/healthz`` or request to miss its deadline fails both tests (within 5 s).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
from bench.processes import quiet_ports
from bench.rawhttp import Response, StreamResult, connect, post_bytes, stream_chat

from tests.e2e.test_cli import CLI, wait_ready
from trio_gateway.ops.log_queue import FLUSH_AT_EXIT_S, LOG_QUEUE_RECORDS

# Every request logs one line (two for a chat request: the gateway's access line and the
# embedded simulator's), more than the queue and the pipe hold together: some must be dropped.
MODELS_REQUESTS = 12_000
CHAT_REQUESTS = 300
STREAMS = 200
CONNECTIONS = 8  # keep-alive connections sharing MODELS_REQUESTS and CHAT_REQUESTS
STREAMS_AT_ONCE = 20
# Generous for a busy 2-core machine: the gateway answers each in a few ms. Before the queue,
# every request after the pipe filled waited forever.
ANSWER_WITHIN_S = 5.0
HEALTHZ_EVERY_S = 0.02
HEALTHZ_WITHIN_S = 2.0
# Once the pipe is read: the queue's lines and the report, then the clean stop's last lines.
REPORT_WITHIN_S = 20.0
EXIT_WITHIN_S = 20.0
# SIGTERM with nothing running and the pipe still unread: the drain ends at once, the log's
# flush gives up after FLUSH_AT_EXIT_S; the rest is the interpreter's exit on a busy machine.
STUCK_EXIT_WITHIN_S = FLUSH_AT_EXIT_S + 5.0
STUCK_REQUESTS = 1_000  # lines enough to fill the pipe's 64 KiB and leave the writer stuck
DROPPED_LINE = re.compile(rb"(\d+) log records dropped")
DROPPED_METRIC = re.compile(rb'^gateway_log_records_dropped_total\{level="(\w+)"\} (\S+)$', re.M)

assert MODELS_REQUESTS + 2 * (CHAT_REQUESTS + STREAMS) > LOG_QUEUE_RECORDS * 1.2


def config_text(port: int, sim_port: int) -> str:
    return f"""
[server]
listen = "127.0.0.1:{port}"
drain_timeout_s = 5.0

[simulators.sim]
listen = "127.0.0.1:{sim_port}"
served_model_name = "m"
max_num_seqs = 64
decode_step_s = 0.002
access_log = true

[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "sim"
type = "openai_compatible"
base_url = "http://127.0.0.1:{sim_port}/v1"
model = "m"
max_inflight = 48
probe = false
"""


def chat_body(*, stream: bool) -> dict[str, object]:
    return {
        "model": "agent-lite",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stream": stream,
    }


@contextmanager
def gateway_into_unread_pipe(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """The gateway serving, its stderr the write end of a pipe whose read end (yielded) nobody
    reads until the test does."""
    port, sim_port = quiet_ports(2)
    path = tmp_path / "gateway.toml"
    path.write_text(config_text(port, sim_port))
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [*CLI, "serve", "--config", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=write_end,
            cwd=tmp_path,
        )
    finally:
        os.close(write_end)
    try:
        wait_ready(port, proc)
        yield proc, port, read_end
    finally:
        if proc.poll() is None:
            proc.kill()  # a process stuck in a write into the pipe dies of it too
        proc.wait()
        os.close(read_end)


async def _keep_alive_requests(port: int, requests: list[bytes], answered: list[int]) -> None:
    stream = await connect("127.0.0.1", port, timeout_s=ANSWER_WITHIN_S)
    async with stream:
        for request in requests:
            with trio.fail_after(ANSWER_WITHIN_S):
                await stream.send_all(request)
                response = Response(stream)
                await response.read_head()
                await response.read_body()
            assert response.status == 200, response.status
            answered.append(response.status)


async def _streams(port: int, results: list[StreamResult]) -> None:
    request = post_bytes("127.0.0.1", port, "/v1/chat/completions", chat_body(stream=True))
    limiter = trio.CapacityLimiter(STREAMS_AT_ONCE)

    async def one(index: int) -> None:
        async with limiter:
            result = StreamResult(index)
            with trio.fail_after(ANSWER_WITHIN_S):
                await stream_chat(
                    result, "127.0.0.1", port, request, connect_timeout_s=ANSWER_WITHIN_S
                )
            assert result.error is None and result.done, (result.error, result.detail)
            results.append(result)

    async with trio.open_nursery() as nursery:
        for index in range(STREAMS):
            nursery.start_soon(one, index)


async def _poll_healthz(port: int, stop: trio.Event, answered: list[float]) -> None:
    request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    stream = await connect("127.0.0.1", port, timeout_s=HEALTHZ_WITHIN_S)
    async with stream:
        while not stop.is_set():
            started = trio.current_time()
            with trio.fail_after(HEALTHZ_WITHIN_S):
                await stream.send_all(request)
                response = Response(stream)
                await response.read_head()
                await response.read_body()
            assert response.status == 200
            answered.append(trio.current_time() - started)
            with trio.move_on_after(HEALTHZ_EVERY_S):
                await stop.wait()


async def _get(port: int, path: str) -> bytes:
    stream = await connect("127.0.0.1", port, timeout_s=ANSWER_WITHIN_S)
    async with stream:
        with trio.fail_after(ANSWER_WITHIN_S):
            await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            response = Response(stream)
            await response.read_head()
            return await response.read_body()


def _read_until(read_end: int, out: bytearray, done: threading.Event) -> None:
    while chunk := os.read(read_end, 1 << 16):
        out += chunk
        if DROPPED_LINE.search(out):
            done.set()
    done.set()


def _dropped_total(metrics: bytes) -> int:
    return sum(int(float(value)) for _, value in DROPPED_METRIC.findall(metrics))


@pytest.mark.slow
async def test_a_stuck_log_reader_stops_nothing_and_the_drops_are_reported(
    tmp_path: Path,
) -> None:
    with gateway_into_unread_pipe(tmp_path) as (proc, port, read_end):
        models = f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        chat = post_bytes("127.0.0.1", port, "/v1/chat/completions", chat_body(stream=False))
        work = [models] * MODELS_REQUESTS + [chat] * CHAT_REQUESTS
        answered: list[int] = []
        streams: list[StreamResult] = []
        healthz: list[float] = []
        stop_polling = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_poll_healthz, port, stop_polling, healthz)
            async with trio.open_nursery() as load:
                for index in range(CONNECTIONS):
                    load.start_soon(_keep_alive_requests, port, work[index::CONNECTIONS], answered)
                load.start_soon(_streams, port, streams)
            stop_polling.set()
        assert len(answered) == len(work)
        assert len(streams) == STREAMS
        # Polled throughout: far more answers than a stalled gateway would give.
        assert len(healthz) >= 10, healthz
        metrics = await _get(port, "/metrics")
        dropped = _dropped_total(metrics)
        assert dropped > 0, "the pipe and the queue never filled: the test proves nothing"

        # The reader comes back: the queue is written out, then the report.
        text = bytearray()
        reported = threading.Event()
        reader = threading.Thread(target=_read_until, args=(read_end, text, reported), daemon=True)
        reader.start()
        assert await trio.to_thread.run_sync(reported.wait, REPORT_WITHIN_S), bytes(text[-2000:])
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert await trio.to_thread.run_sync(proc.wait, EXIT_WITHIN_S) == 0
        await trio.to_thread.run_sync(reader.join, EXIT_WITHIN_S)
        assert time.monotonic() - started < EXIT_WITHIN_S
        log = bytes(text)
        assert sum(int(n) for n in DROPPED_LINE.findall(log)) == dropped, log[-2000:]
        # The clean stop's last lines got out: the flush at exit.
        assert b"SIGTERM: draining" in log
        assert b"Traceback" not in log


@pytest.mark.slow
async def test_a_stuck_log_reader_does_not_hold_the_exit(tmp_path: Path) -> None:
    with gateway_into_unread_pipe(tmp_path) as (proc, port, _):
        models = f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        answered: list[int] = []
        await _keep_alive_requests(port, [models] * STUCK_REQUESTS, answered)
        assert len(answered) == STUCK_REQUESTS
        metrics = await _get(port, "/metrics")
        assert b"gateway_log_records_dropped_total" in metrics
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        # Never read: the writer is stuck in its write when the flush at exit begins.
        assert await trio.to_thread.run_sync(proc.wait, STUCK_EXIT_WITHIN_S) == 0
        assert time.monotonic() - started < STUCK_EXIT_WITHIN_S
