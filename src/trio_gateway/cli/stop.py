"""``trio-gateway stop``: SIGTERM to the gateways serving a config file, which then drain.

The same lookup as ``reload`` (``--pid``, or every ``trio-gateway serve`` on this host whose
``--config`` is this file; of ``[server] workers``, the supervisor, which passes it on). A
gateway runs as ``python3 .../trio-gateway serve ...``, so ``pidof trio-gateway`` finds nothing.
It returns once the signals are sent: the drain goes on (``/readyz`` answers 503 meanwhile).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from trio_gateway.cli.reload import find_gateways
from trio_gateway.config.schema import DEFAULT_CONFIG_NAME


def stop_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="trio-gateway stop",
        description="Send SIGTERM to the gateways serving a config file: each drains (running "
        "answers finish, for up to server.drain_timeout_s), then exits. A second stop ends "
        "them at once.",
    )
    parser.add_argument(
        "--config", default=DEFAULT_CONFIG_NAME, help="config file (default: ./gateway.toml)"
    )
    parser.add_argument(
        "--pid", type=int, action="append", help="signal this process (repeatable) instead"
    )
    args = parser.parse_args(argv)
    pids = args.pid or find_gateways(Path(args.config))
    if not pids:
        print(
            f"trio-gateway stop: no `trio-gateway serve --config {args.config}` runs on this "
            "host; give --pid PID",
            file=sys.stderr,
        )
        return 1
    failed = False
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError as exc:
            print(f"trio-gateway stop: pid {pid}: {exc.strerror or exc}", file=sys.stderr)
            failed = True
        else:
            print(f"sent SIGTERM to pid {pid}: it drains, then exits")
    return 1 if failed else 0
