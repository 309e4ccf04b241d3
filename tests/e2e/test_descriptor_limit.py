"""A gateway driven into its descriptor limit (a lowered ``RLIMIT_NOFILE``) answers 503
``overloaded`` with ``Retry-After``, never a 500, logs it without a traceback, counts it, and
serves again once streams end (core/descriptors.py, http1/exhaustion.py)."""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest
import trio
from bench.processes import free_port

from tests.e2e.test_cli import wait_ready

# Low enough that 40 streams (two descriptors each) cannot all fit beside what the
# interpreter, the listeners and the log hold at start, high enough to start at all.
LIMIT = 72
STREAMS = 40


@pytest.fixture
def sim() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trio_gateway.sim",
            "--listen",
            f"127.0.0.1:{port}",
            "--max-num-seqs",
            "256",
            "--decode-step-s",
            "0.05",
            "--default-reasoning-tokens",
            "0",
            "--default-text-tokens",
            "30",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(200):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield port
    finally:
        proc.kill()
        proc.communicate()


def limited(soft_and_hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft_and_hard, soft_and_hard))


async def one_stream(port: int, results: list[tuple[int, bytes, bytes]]) -> None:
    body = json.dumps(
        {"model": "lite", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = b""
    async with stream:
        try:
            await stream.send_all(head + body)
            while chunk := await stream.receive_some(65536):
                received += chunk
        except trio.BrokenResourceError:
            pass  # a reset after the answer was read: the answer is what counts
    status_line, _, rest = received.partition(b"\r\n")
    match = re.match(rb"HTTP/1\.1 (\d+)", status_line)
    results.append((int(match.group(1)) if match else 0, rest.partition(b"\r\n\r\n")[0], rest))


@attrs.frozen
class Gateway:
    port: int
    proc: subprocess.Popen[str]


@pytest.fixture
def gateway(tmp_path: Path, sim: int) -> Iterator[Gateway]:
    """A gateway whose process may hold at most ``LIMIT`` descriptors; checks its log at the
    end: the exhaustion said, once an interval, and never a traceback."""
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"""
[server]
listen = "127.0.0.1:{port}"
[auth]
open = true
[aliases.lite]
[[aliases.lite.providers]]
name = "sim"
type = "openai_compatible"
base_url = "http://127.0.0.1:{sim}/v1"
model = "qwen3-32b"
max_inflight = 200
"""
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "trio_gateway", "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: limited(LIMIT),
    )
    try:
        wait_ready(port, proc)
        yield Gateway(port, proc)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "out of file descriptors" in err, err[-2000:]
    assert "Traceback" not in err, err[-4000:]
    assert "internal error" not in err, err[-4000:]
    assert "below what the providers' max_inflight may hold" in err, err[-2000:]
    # Once an interval, not once a refusal.
    assert err.count("out of file descriptors (") <= 2, err[-2000:]


async def exhausted_counts(port: int) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=10) as client:
        metrics = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    return {
        where: float(value)
        for where, value in re.findall(
            r'gateway_descriptors_exhausted_total\{where="(\w+)"\} (\S+)', metrics
        )
    }


async def test_streams_past_the_limit_get_503_overloaded_and_the_gateway_goes_on(
    gateway: Gateway,
) -> None:
    port = gateway.port
    results: list[tuple[int, bytes, bytes]] = []
    async with trio.open_nursery() as nursery:
        for _ in range(STREAMS):
            nursery.start_soon(one_stream, port, results)
    statuses = sorted(status for status, _, _ in results)
    assert set(statuses) <= {200, 503}, statuses
    assert 200 in statuses and 503 in statuses, statuses
    for status, head, whole in results:
        if status == 503:
            assert b"retry-after: 1" in head.lower(), head
            assert b'"code": "overloaded"' in whole or b'"code":"overloaded"' in whole
        else:
            assert b"data: [DONE]" in whole[-300:], whole[-300:]
    # Streams ended: descriptors are back, and the gateway serves as before.
    async with httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "lite", "messages": [{"role": "user", "content": "again"}]},
        )
        assert answer.status_code == 200, answer.text
    counted = await exhausted_counts(port)
    assert sum(counted.values()) >= statuses.count(503), (counted, statuses)


async def test_connections_past_the_limit_are_refused_at_accept_with_a_503(
    gateway: Gateway,
) -> None:
    """Idle connections (no request yet) hold one descriptor each: past the limit the
    gateway cannot accept, and answers the next waiting one with a 503 rather than leave it
    in the backlog until its client gives up."""
    held: list[trio.SocketStream] = []
    answers: list[bytes] = []

    async def read_answer(stream: trio.SocketStream) -> None:
        answers.append(await stream.receive_some(65536))

    try:
        for _ in range(LIMIT + 8):
            held.append(await trio.open_tcp_stream("127.0.0.1", gateway.port))
        # The accepted ones wait for a request head; the refused ones have their answer now.
        with trio.move_on_after(2):
            async with trio.open_nursery() as nursery:
                for stream in held:
                    nursery.start_soon(read_answer, stream)
        refused = 0
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert b"retry-after: 1" in answer.lower(), answer
            assert b'"code": "overloaded"' in answer, answer
            refused += 1
    finally:
        for stream in held:
            await stream.aclose()
    assert refused >= 1
    counted = await exhausted_counts(gateway.port)
    assert counted["accept"] >= refused, counted
    async with httpx.AsyncClient(timeout=10) as client:
        again = await client.post(
            f"http://127.0.0.1:{gateway.port}/v1/chat/completions",
            json={"model": "lite", "messages": [{"role": "user", "content": "again"}]},
        )
    assert again.status_code == 200, again.text
