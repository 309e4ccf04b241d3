"""An OTLP/HTTP trace sink for the benchmarks: takes every ``POST /v1/traces`` and answers 200
with an empty ``ExportTraceServiceResponse``, decoding nothing (its cost is its own process's,
never the gateway's). ``GET /health`` answers 200; ``GET /stats`` the exports and bytes taken.

    .venv/bin/python -m bench.otlp_sink --listen 127.0.0.1:4318
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.processes import PYTHON, Child, free_port, running

_lock = threading.Lock()
_stats = {"exports": 0, "bytes": 0}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        with _lock:
            _stats["exports"] += 1
            _stats["bytes"] += len(body)
        self._answer(200, b"", "application/x-protobuf")

    def do_GET(self) -> None:
        if self.path == "/stats":
            with _lock:
                payload = json.dumps(_stats).encode()
            self._answer(200, payload, "application/json")
        else:
            self._answer(200 if self.path == "/health" else 404, b"ok", "text/plain")

    def _answer(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def running_sink(work: Path) -> Iterator[str]:
    """The sink as a process of its own; yields its traces URL."""
    port = free_port()
    argv = [PYTHON, "-m", "bench.otlp_sink", "--listen", f"127.0.0.1:{port}"]
    base = f"http://127.0.0.1:{port}"
    with running("otlp sink", argv, log_path=work / "sink.log", ready_url=base + "/health"):
        yield base + "/v1/traces"


def tracing_table(ratio: float, url: str) -> str:
    """``[tracing]`` at ``ratio``, exporting to ``url`` (the sink's)."""
    return f'[tracing]\notlp_endpoint = "{url}"\nsample_ratio = {ratio!r}\n'


def add_flag(parser: argparse.ArgumentParser) -> None:
    """The scenarios' ``--gateway-tracing RATIO`` (bench/harness.py)."""
    parser.add_argument(
        "--gateway-tracing",
        type=float,
        default=None,
        metavar="RATIO",
        help="[tracing] at this sample ratio in the gateways, exporting to bench/otlp_sink.py",
    )


def spawned(
    ratio: float | None, spawn: Callable[[str, list[str], Path], Child], logs: Path
) -> tuple[list[tuple[Child, str]], str]:
    """For a scenario's stack: the sink's process (started with ``spawn``) and its health URL,
    and the ``[tracing]`` table the gateways get; neither when ``ratio`` is None."""
    if ratio is None:
        return [], ""
    port = free_port()
    argv = [PYTHON, "-m", "bench.otlp_sink", "--listen", f"127.0.0.1:{port}"]
    child = spawn("otlp sink", argv, logs / "otlp-sink.log")
    base = f"http://127.0.0.1:{port}"
    return [(child, base + "/health")], "\n" + tracing_table(ratio, base + "/v1/traces")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--listen", default="127.0.0.1:4318")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
