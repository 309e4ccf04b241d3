"""Where the gateway's CPU goes while it relays streams: py-spy on the gateway process.

The simulator streams at ``--tokens-per-s`` per stream, the gateway (the same config as
``bench/chunk_instructions.py``) relays, the load runs in this process; py-spy samples the
gateway for the whole load and the inclusive share of each function is printed, largest first.
Shares, not times: they hold on a shared machine where CPU time does not.

    .venv/bin/python -m bench.profile_chunks [--streams 60 --tokens 600 --top 60]

Needs py-spy (the ``bench`` extra: ``make bench`` installs it). About 30 s.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import trio

from bench.chunk_instructions import SERVED_MODEL, gateway_config, load
from bench.processes import PYTHON, free_port, running

_FRAME = re.compile(r"^(?P<function>.*) \((?P<path>.*?):\d+\)$")


def frame_key(frame: str) -> str:
    """``function (package/module.py)``: the line number dropped, the path cut to the package."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match["path"].split("site-packages/")[-1].split("/src/")[-1]
    return f"{match['function']} ({path})"


def inclusive_shares(raw: str) -> tuple[int, list[tuple[str, float]]]:
    """(samples, [(function, share of the samples whose stack holds it)]) from py-spy's raw
    format: one ``frame;frame;... count`` line per distinct stack."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        for key in {frame_key(frame) for frame in stack.split(";")}:
            counts[key] += int(count)
    return total, [(key, n / total) for key, n in counts.most_common()] if total else []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--streams", type=int, default=60)
    parser.add_argument("--tokens", type=int, default=600, help="per stream")
    parser.add_argument("--tokens-per-s", type=float, default=50.0, help="per stream")
    parser.add_argument("--rate-hz", type=int, default=250, help="py-spy's sampling rate")
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw output here")
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(PYTHON).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("py-spy is not installed (pip install '.[bench]')", file=sys.stderr)
        return 2
    sim_port, port = free_port(), free_port()
    sim_url, base = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{port}"
    sim_argv = [PYTHON, "-m", "trio_gateway.sim", "--listen", f"127.0.0.1:{sim_port}"]
    sim_argv += ["--served-model-name", SERVED_MODEL, "--max-num-seqs", "256"]
    sim_argv += ["--decode-step-s", str(1.0 / args.tokens_per_s), "--decode-step-s-per-seq", "0"]
    sim_argv += ["--no-access-log"]
    with tempfile.TemporaryDirectory(prefix="profile-chunks-") as tmp:
        work = Path(tmp)
        config = work / "gateway.toml"
        config.write_text(gateway_config(f"127.0.0.1:{port}", sim_url))
        gateway_argv = [PYTHON, "-m", "trio_gateway", "serve", "--config", str(config)]
        gateway_argv += ["--log-level", "warning"]
        out = work / "profile.txt"
        with (
            running("sim", sim_argv, log_path=work / "sim.log", ready_url=sim_url + "/health"),
            running(
                "gateway", gateway_argv, log_path=work / "gw.log", ready_url=base + "/healthz"
            ) as gateway,
        ):
            spy_argv = [py_spy, "record", "--nonblocking", "-f", "raw", "-o", str(out)]
            spy_argv += ["-r", str(args.rate_hz), "-p", str(gateway.process.pid)]
            spy = subprocess.Popen(spy_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            started = time.monotonic()
            chunks = trio.run(load, base + "/v1/chat/completions", args.streams, args.tokens)
            elapsed_s = time.monotonic() - started
            spy.send_signal(2)  # SIGINT: py-spy writes what it has and exits
            spy.wait(timeout=30)
        raw = out.read_text()
        if args.raw is not None:
            args.raw.write_text(raw)
        samples, shares = inclusive_shares(raw)
    print(f"{chunks} chunks in {elapsed_s:.1f} s; {samples} samples of the gateway")
    for key, share in shares[: args.top]:
        print(f"{100 * share:5.1f} %  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
