"""The vLLM simulator as the benchmarks run it: ``trio_gateway.sim`` plus two things only a
benchmark needs, added here rather than in the simulator.

- **An abort log.** Each sequence the engine removes before its end (an abort: its client went
  away) is appended to ``--abort-log`` as ``<time.monotonic()> <n_tokens> <prompt_tokens>``,
  the time being when the simulator learned that the client left (when vLLM would ask its
  engine to abort), or, for a sequence cut another way, when it was removed.
  CLOCK_MONOTONIC is one clock for every process of the machine, so the load generator can set
  the instant its client left against the instant the simulator saw it (scenario D), and
  ``n_tokens`` tells which request it was (the benchmark gives the one it cancels a length no
  other request has).
- **A listen backlog** (``--backlog``, default 2048, uvicorn's and so vLLM's default): 5,000
  clients connecting at once would otherwise overflow a small default and measure the
  simulator's accept queue, not what is in front of it.

    python -m bench.sim_server --abort-log aborts.txt --backlog 2048 -- --max-num-seqs 64 ...

Everything after ``--`` is a ``python -m trio_gateway.sim`` flag.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any

import trio

from bench.procstat import raise_nofile_limit
from trio_gateway.process.serve import freeze_start_up
from trio_gateway.sim.cli import parse_args as parse_sim_args
from trio_gateway.sim.config import SimConfig
from trio_gateway.sim.engine import SimEngine, SimSequence
from trio_gateway.sim.server import SimHandle, serve_sim

DEFAULT_BACKLOG = 2048


class AbortLoggingEngine(SimEngine):
    def __init__(self, config: SimConfig, log: IO[str]) -> None:
        super().__init__(config)
        self._log = log
        self._left_at: dict[int, float] = {}  # a live sequence whose client left: since when

    def _mark_client_left(self, seq_id: int) -> None:
        self._left_at.setdefault(seq_id, time.monotonic())
        super()._mark_client_left(seq_id)

    @contextmanager
    def sequence(self, **kwargs: Any) -> Iterator[SimSequence]:
        # The scheduler's counter, not stats(): that snapshot copies the recorded request
        # bodies, too much work per request at thousands of requests per second (scenario A).
        before = self._sched.counters.aborts
        seq_id: int | None = None
        try:
            with super().sequence(**kwargs) as seq:
                seq_id = seq.seq_id
                yield seq
        finally:
            left_at = self._left_at.pop(seq_id, None) if seq_id is not None else None
            # The engine counts the abort while leaving its own block: compare after it.
            if self._sched.counters.aborts > before:
                when = left_at if left_at is not None else time.monotonic()
                self._log.write(f"{when:.6f} {kwargs['n_tokens']} {kwargs['prompt_tokens']}\n")
                self._log.flush()


async def serve(config: SimConfig, host: str, port: int, backlog: int, log: IO[str]) -> None:
    engine = AbortLoggingEngine(config, log)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            handle: SimHandle = await nursery.start(
                partial(serve_sim, config, host=host, port=port, backlog=backlog, engine=engine)
            )
            # The gateway's collector policy (start-up frozen, full passes rare): at thousands
            # of streams the simulator's own full passes held its loop for a second.
            freeze_start_up()
            print(f"bench simulator on {handle.base_url}/v1 (backlog {backlog})", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def read_abort_log(path: Path) -> list[tuple[float, int, int]]:
    """The abort log's lines as (monotonic time, n_tokens, prompt_tokens)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    entries = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            entries.append((float(parts[0]), int(parts[1]), int(parts[2])))
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    split = args.index("--") if "--" in args else len(args)
    ours, sim_flags = args[:split], args[split + 1 :]
    parser = argparse.ArgumentParser(prog="python -m bench.sim_server", description=__doc__)
    parser.add_argument("--abort-log", type=Path, required=True)
    parser.add_argument("--backlog", type=int, default=DEFAULT_BACKLOG)
    a = parser.parse_args(ours)
    config, host, port = parse_sim_args(sim_flags)
    raise_nofile_limit()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with a.abort_log.open("a", encoding="utf-8") as log:
        trio.run(serve, config, host, port, a.backlog, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
