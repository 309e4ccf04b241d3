"""``trio-gateway reload``: check a config file, then ask the gateways serving it to reload.

The file is checked here first, so a mistake is shown to whoever typed the command and no
signal is sent. The gateway checks it again when it reloads (the file may change in between)
and logs the outcome; ``gateway_config_reloads_total`` counts it.

Which processes: ``--pid``, or every ``trio-gateway serve`` on this host whose ``--config``
is this file (read from ``/proc``: Linux); of ``[server] workers``, the supervisor, which
passes the signal on to its workers.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from trio_gateway.config.load import load_config
from trio_gateway.config.schema import DEFAULT_CONFIG_NAME, ConfigError

EXIT_CONFIG = 2
PROC = Path("/proc")


def serve_config(argv: Sequence[str]) -> str | None:
    """The config path a ``trio-gateway serve`` command line names (as typed), or None when
    the command line is not one (pure)."""
    words = list(argv)
    program = [i for i, w in enumerate(words) if _is_gateway(w, words[i + 1 : i + 2])]
    if not program:
        return None
    rest = words[program[0] + 1 :]
    if rest[:1] == ["trio_gateway"]:  # python -m trio_gateway
        rest = rest[1:]
    if rest[:1] != ["serve"]:
        return None
    config = DEFAULT_CONFIG_NAME
    args = rest[1:]
    if any(a == "--worker-fd" or a.startswith("--worker-fd=") for a in args):
        return None  # a worker: its supervisor passes the signal on (workers.py)
    for i, word in enumerate(args):
        if word == "--config" and i + 1 < len(args):
            config = args[i + 1]
        elif word.startswith("--config="):
            config = word.removeprefix("--config=")
    return config


def _is_gateway(word: str, following: Sequence[str]) -> bool:
    if Path(word).name == "trio-gateway":
        return True
    return word == "-m" and list(following) == ["trio_gateway"]


def _processes() -> Iterator[tuple[int, list[str], Path]]:
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
            cwd = (entry / "cwd").resolve()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        yield int(entry.name), raw.decode("utf-8", "replace").split("\0")[:-1], cwd


def find_gateways(config: Path) -> list[int]:
    """The pids of ``trio-gateway serve`` processes serving ``config`` (resolved)."""
    wanted = config.resolve()
    found = []
    for pid, argv, cwd in _processes():
        named = serve_config(argv)
        if named is not None and (cwd / named).resolve() == wanted:
            found.append(pid)
    return sorted(found)


def reload_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="trio-gateway reload",
        description="Check a config file, then send SIGHUP to the gateways serving it.",
    )
    parser.add_argument(
        "--config", default=DEFAULT_CONFIG_NAME, help="config file (default: ./gateway.toml)"
    )
    parser.add_argument(
        "--pid", type=int, action="append", help="signal this process (repeatable) instead"
    )
    args = parser.parse_args(argv)
    try:
        load_config(args.config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{exc.source}: {problem}", file=sys.stderr)
        print(f"{exc.source}: {len(exc.problems)} problem(s); no reload sent", file=sys.stderr)
        return EXIT_CONFIG
    pids = args.pid or find_gateways(Path(args.config))
    if not pids:
        print(
            f"trio-gateway reload: no `trio-gateway serve --config {args.config}` runs on this "
            "host; give --pid PID",
            file=sys.stderr,
        )
        return 1
    failed = False
    for pid in pids:
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError as exc:
            print(f"trio-gateway reload: pid {pid}: {exc.strerror or exc}", file=sys.stderr)
            failed = True
        else:
            print(f"sent SIGHUP to pid {pid}")
    if not failed:
        print(
            "the gateway logs the outcome (reload: ... applied / nothing changed) and counts it "
            "in gateway_config_reloads_total"
        )
    return 1 if failed else 0
