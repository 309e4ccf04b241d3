"""CPU per relayed chunk of an alias's output filter, in process: ``StreamFilter.events`` on the
simulator's answer tokens, one chunk per call, as ``dispatch/relay.py`` calls it. Scenario B's
``gateway+filter`` mode (docs/benchmarks.md) measures the same filter in the whole process; this
is its filter alone, so a change to the filter is judged here first.

    .venv/bin/python -m bench.filter_cost [--chunks 100000] [--case literals]

Cases: ``literals`` (B's 1,000 patterns, ``bench/stream_timing.filter_words``, matching nothing),
``literals+regex`` (the same and an SSN-shaped regex), ``masked`` (a pattern the answer says). On a
busy machine time moves by ±15 %: count instructions instead, the difference of two runs under
``valgrind --tool=cachegrind --cache-sim=no`` (``--chunks`` N and 0) divided by N.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from bench.stream_timing import filter_words
from trio_gateway.core.events import ResponseStarted, TextDelta
from trio_gateway.core.filter_match import FilterSpec
from trio_gateway.core.filters import StreamFilter, alias_filters
from trio_gateway.sim.text import TEXT_VOCABULARY, vocabulary_tokens

SSN = r"\b\d{3}-\d{2}-\d{4}\b"
CASES = {
    "literals": lambda: [FilterSpec(name="words", patterns=tuple(filter_words(1000)))],
    "literals+regex": lambda: [
        FilterSpec(name="words", patterns=tuple(filter_words(1000)), regex=(SSN,))
    ],
    "masked": lambda: [FilterSpec(name="weather", patterns=("weather", "晴天", "мир"))],
}


def run(case: str, chunks: int) -> float:
    """CPU seconds per chunk of ``case`` over ``chunks`` of the simulator's answer tokens."""
    output = alias_filters(CASES[case](), ()).output
    assert output is not None
    tokens = vocabulary_tokens(TEXT_VOCABULARY, chunks, seed=30)
    stream = StreamFilter(output)
    stream.events([ResponseStarted("bench")])
    start = time.process_time()
    for token in tokens:
        stream.events([TextDelta(token)])
        stream.matched.clear()
    elapsed = time.process_time() - start
    return elapsed / max(chunks, 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    args = parser.parse_args(argv)
    print("| case | CPU per chunk (µs) |")
    print("| --- | --- |")
    for case in args.case or list(CASES):
        print(f"| {case} | {run(case, args.chunks) * 1e6:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
