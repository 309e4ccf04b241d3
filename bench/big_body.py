"""Does a big body delay anyone? (issue 39, item 4)

``trio-gateway serve`` (the default config, its built-in simulator, an input filter on the
alias) in a process of its own; ``/healthz`` polled from another (``healthz_poller.py``, every
20 ms, each poll counted from when it was due); and big bodies sent to it again and again for
two seconds, from this one:

- ``parts``: 4 MiB of 130,000 text blocks in one message, to ``/v1/chat/completions``;
- ``messages``: the same as Anthropic text blocks, to ``/v1/messages``, two clients at once;
- ``filtered``: 4 MiB of text in 2,000 parts, the input filter's word in the last one.

For each: how the bodies were answered and how long each took, and the polls' latency while
they were (p50, p99, max). The gateway is whatever ``python -m trio_gateway`` imports: run it
with ``PYTHONPATH=<another checkout>/src`` to measure that one::

    .venv/bin/python -m bench.big_body
    .venv/bin/python -m bench.big_body --parse   # the reading alone: json, msgspec, pieces
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx

from bench.processes import free_port, running

ROOT = Path(__file__).resolve().parents[1]
# 50 polls a second, each counted from when it was due, so that a stall shows in every poll
# it held back (coordinated omission). Every 5 ms, a poll's own cost while a worker thread
# reads a body (a few hand-offs of the GIL) would outgrow the interval and the polls queue:
# a measure of throughput, not of delay.
POLL_INTERVAL_S = 0.020
# How long bodies are sent, one after another: some 100 polls.
WINDOW_S = 2.0
MAX_BODY_BYTES = 4 * 1024 * 1024
TIMEOUT_S = 60.0
TINY_PARTS = 130_000
FILTERED_WORD = "leak-this"
FILTERS = f"""
[filters.inbound]
patterns = ["{FILTERED_WORD}", "project falcon", "机密"]
"""


def tiny_parts(count: int) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "x"} for _ in range(count)]


def chat_body(parts: list[dict[str, Any]]) -> bytes:
    body = {"model": "agent-lite", "messages": [{"role": "user", "content": parts}]}
    return json.dumps(body).encode()


def messages_body(parts: list[dict[str, Any]]) -> bytes:
    body = {
        "model": "agent-lite",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": parts}],
    }
    return json.dumps(body).encode()


def filtered_body() -> bytes:
    """Just under 4 MiB of text in 2,000 parts, the filtered word in the last one."""
    part = ("the quick brown fox jumps over a lazy dog " * 49)[:2000]
    parts = [{"type": "text", "text": part} for _ in range(1999)]
    parts.append({"type": "text", "text": f"{part} {FILTERED_WORD}"})
    return chat_body(parts)


@contextmanager
def filtered_gateway(folder: Path) -> Iterator[int]:
    """The default config on free ports with an input filter on ``agent-lite``, served by
    ``python -m trio_gateway`` in a process of its own (its log in ``folder``); its port."""
    port, sim_port = free_port(), free_port()
    text = (ROOT / "gateway.toml").read_text()
    text = text.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    text = text.replace("127.0.0.1:8001", f"127.0.0.1:{sim_port}")
    text = text.replace(
        "[aliases.agent-lite]\n", '[aliases.agent-lite]\ninput_filters = ["inbound"]\n'
    )
    config = folder / "gateway.toml"
    config.write_text(text + FILTERS)
    argv = [sys.executable, "-m", "trio_gateway", "serve", "--config", str(config)]
    # Its log to a file: a pipe nobody reads would fill and hold the gateway up.
    with running(
        "gateway",
        argv,
        log_path=folder / "gateway.log",
        ready_url=f"http://127.0.0.1:{port}/readyz",
    ):
        yield port


class Poller:
    """``healthz_poller.py`` in a process of its own, against ``port``."""

    def __init__(self, port: int, interval_s: float = POLL_INTERVAL_S) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.healthz_poller", str(port), str(interval_s)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ready(self) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line != "ready\n":
            raise RuntimeError(f"the poller did not start: {line!r}")

    def polls(self) -> list[tuple[float, float]]:
        """Stops polling; every poll's (due at, latency)."""
        try:
            out, _ = self.process.communicate("", timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGKILL)
        return [(due, latency) for due, latency in json.loads(out)]


@attrs.frozen
class Run:
    """Bodies sent for :data:`WINDOW_S` while /healthz was polled."""

    answers: list[httpx.Response]
    seconds: list[float]  # each body's, sent to answered
    latencies: list[float]  # the polls due meanwhile (and 0.1 s after the last answer)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def sent_while_polled(port: int, path: str, raw: bytes, *, senders: int = 1) -> Run:
    """``raw`` sent to ``path`` again and again, by ``senders`` clients at once, for
    :data:`WINDOW_S`, while /healthz is polled."""
    assert len(raw) <= MAX_BODY_BYTES
    answers: list[httpx.Response] = []
    seconds: list[float] = []

    def send(until: float) -> None:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            while time.monotonic() < until:
                started = time.monotonic()
                answers.append(
                    client.post(
                        f"http://127.0.0.1:{port}{path}",
                        content=raw,
                        headers={"content-type": "application/json"},
                    )
                )
                seconds.append(time.monotonic() - started)

    poller = Poller(port)
    try:
        poller.ready()
        time.sleep(0.1)  # a few polls before: the schedule is running
        started = time.monotonic()
        with ThreadPoolExecutor(senders) as pool:
            for sender in [pool.submit(send, started + WINDOW_S) for _ in range(senders)]:
                sender.result()
        ended = time.monotonic()
        time.sleep(0.2)
    finally:
        polls = poller.polls()
    during = [latency for due, latency in polls if started <= due <= ended + 0.1]
    return Run(answers, seconds, during)


def parts_body() -> bytes:
    return chat_body(tiny_parts(TINY_PARTS))


def blocks_body() -> bytes:
    return messages_body(tiny_parts(TINY_PARTS))


# (path, the body, clients sending at once)
CASES: dict[str, tuple[str, Callable[[], bytes], int]] = {
    "parts": ("/v1/chat/completions", parts_body, 1),
    "messages": ("/v1/messages", blocks_body, 2),
    "filtered": ("/v1/chat/completions", filtered_body, 1),
}
HEADER = "case      bodies  answer                  s per body (max)   healthz p50 / p99 / max ms"


def tokens_body() -> bytes:
    """A completion's prompt of 128,000 token ids (some 0.8 MB): many values, few objects."""
    body = {"model": "agent-lite", "prompt": [i % 150_000 for i in range(128_000)]}
    return json.dumps(body).encode()


def parse_times(repeat: int = 5) -> None:
    """Reading each body (the best of ``repeat``, ms): json.loads, msgspec whole, and the
    gateway's reader (msgspec in pieces, the parts counted first: the chat front's paths)."""
    import json as json_module

    import msgspec

    from trio_gateway.core.body import CHAT_PARTS, loads
    from trio_gateway.core.errors import GatewayError

    def best(read: Callable[[], object]) -> float:
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            with contextlib.suppress(GatewayError):  # refused: the parts bound
                read()
            times.append(time.perf_counter() - started)
        return min(times) * 1000

    decoder = msgspec.json.Decoder()
    print("body       MB  json.loads  msgspec  in pieces  in pieces, parts bounded")
    for name, make in (("parts", parts_body), ("filtered", filtered_body), ("tokens", tokens_body)):
        raw = make()
        readers: tuple[Callable[[bytes], object], ...] = (
            json_module.loads,
            decoder.decode,
            loads,
            partial(loads, parts=CHAT_PARTS),
        )
        ms = [best(partial(read, raw)) for read in readers]
        print(
            f"{name:9} {len(raw) / 1e6:4.1f}  {ms[0]:10.0f}  {ms[1]:7.0f}  {ms[2]:9.0f}"
            f"  {ms[3]:9.0f}"
        )


def main() -> None:
    import tempfile

    if sys.argv[1:] == ["--parse"]:
        parse_times()
        return
    with tempfile.TemporaryDirectory() as folder, filtered_gateway(Path(folder)) as port:
        print(HEADER)
        for name, (path, make, senders) in CASES.items():
            run = sent_while_polled(port, path, make(), senders=senders)
            codes = sorted({f"{a.status_code} {code_of(a)}" for a in run.answers})
            ms = [latency * 1000 for latency in run.latencies]
            print(
                f"{name:9} {len(run.answers):6}  {', '.join(codes):22}  "
                f"{sum(run.seconds) / len(run.seconds):5.2f} ({max(run.seconds):5.2f})     "
                f"{percentile(ms, 0.5):5.0f} / {percentile(ms, 0.99):5.0f} / {max(ms):5.0f}"
                f"   ({len(ms)} polls)"
            )


def code_of(answer: httpx.Response) -> str:
    try:
        error = answer.json()["error"]
    except (ValueError, KeyError, TypeError):
        return "-"
    return str(error.get("code") or error.get("type"))


if __name__ == "__main__":
    main()
