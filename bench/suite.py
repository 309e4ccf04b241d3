"""The performance suite, scenario after scenario: ``make bench`` (issue 12's five, A to E).

Each scenario runs in its own process (``python -m bench.<name>``), so one scenario's memory
and raised limits never carry into the next. To keep the suite within its time budget (well
under 10 minutes on 2 cores; about 8 measured) the cancellation scenario runs with one
gateway (``--max-inflight 32``, equal to the simulator's batch; ``python -m
bench.cancellation`` alone also runs ``max_inflight = 28``), and the scale scenario cuts each
mode at 60 s, not 120 (its direct and gateway modes take about 40 s; the naive proxy completes
none either way). A and B run their extra modes by default (issue 33: A through nginx and
through the gateway on two workers, B through nginx; about 35 s more), nginx left out with a
note where it is not installed. The fleet routing
study (F, issue 13: about 6 minutes of its own) is ``--only fleet`` or ``make bench-fleet``; the
priority classes (G, issue 30: about 3 minutes) ``--only priority`` or ``make bench-priority``;
C on the real CPU vLLM (issue 33: about 3 minutes, needs ``make vllm-model``) ``--only
cancellation_vllm`` or ``make bench-vllm``.

    .venv/bin/python -m bench.suite [--only overhead,scale] [--smoke] [--no-plots]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence

from bench.procstat import loadavg

SCENARIOS: dict[str, tuple[str, ...]] = {
    "overhead": (),  # A
    "stream_timing": (),  # B
    "cancellation": ("--max-inflight", "32"),  # C
    "scale": ("--deadline-s", "60"),  # D
    "slow_clients": (),  # E
    "fleet": (),  # F, not in the default run
    "priority": (),  # G, not in the default run
    "cancellation_vllm": (),  # C on real vLLM (issue 33), not in the default run
}
DEFAULT = ("overhead", "stream_timing", "cancellation", "scale", "slow_clients")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__)
    p.add_argument("--only", default=",".join(DEFAULT), help="comma-separated scenarios")
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    p.add_argument("--no-plots", action="store_true")
    a = p.parse_args(argv)
    chosen = [name.strip() for name in a.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    extra = [*(["--smoke"] if a.smoke else []), *(["--no-plots"] if a.no_plots else [])]
    started = time.monotonic()
    times: dict[str, tuple[float, int]] = {}
    for name in chosen:
        print(f"\n## {name} (load average {loadavg()})\n", flush=True)
        t0 = time.monotonic()
        argv_ = [sys.executable, "-m", f"bench.{name}", *SCENARIOS[name], *extra]
        code = subprocess.run(argv_, check=False).returncode
        times[name] = (time.monotonic() - t0, code)
    total = time.monotonic() - started
    print("\n| scenario | wall (s) | exit |\n| --- | --- | --- |")
    for name, (wall, code) in times.items():
        print(f"| {name} | {wall:.0f} | {code} |")
    print(f"| total | {total:.0f} | |")
    return max((code for _, code in times.values()), default=0)


if __name__ == "__main__":
    sys.exit(main())
