"""``trio-gateway reload``: check a config file, then ask the gateways serving it to reload.

The file is checked here first, so a mistake is shown to whoever typed the command and no
signal is sent. The gateway checks it again when it reloads (the file may change in between,
and only it knows what a restart would need) and logs the outcome; ``gateway_config_reloads_total``
counts it. This command then waits for that outcome (``process/reload_status.py``): exit 0 when
every process applied the file, 1 with the reasons when one refused it, or when none said
within ``--timeout``.

Which processes: ``--pid``, or every ``trio-gateway serve`` on this host whose ``--config``
is this file (read from ``/proc``: Linux); of ``[server] workers``, the supervisor, which
passes the signal on to its workers.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from trio_gateway.config.load import load_config
from trio_gateway.config.schema import DEFAULT_CONFIG_NAME, ConfigError
from trio_gateway.process.reload_status import ReloadStatus, read_status, status_dir

EXIT_CONFIG = 2
PROC = Path("/proc")
# A reload is decided in milliseconds (the file is read and checked, the switch is instant);
# the default leaves room for a busy host.
DEFAULT_TIMEOUT_S = 10.0
POLL_S = 0.05


def serve_config(argv: Sequence[str]) -> str | None:
    """The config path a ``trio-gateway serve`` command line names (as typed), or None when
    the command line is not one (pure)."""
    words = list(argv)
    program = [i for i, w in enumerate(words) if _is_gateway(w, words[i + 1 : i + 2])]
    # The gateway itself, not a command that runs it (`timeout 60 trio-gateway serve`,
    # `strace ...`): those pass a signal on, so signalling both would signal the gateway twice,
    # and a second SIGTERM stops it at once.
    if not program or not _is_interpreter(words[: program[0]]):
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


def _is_interpreter(words: Sequence[str]) -> bool:
    """What may come before the program's name: nothing (its own shebang or a frozen binary),
    or a Python interpreter and its options (``python3 -X dev -m trio_gateway``)."""
    return not words or Path(words[0]).name.startswith("python")


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


def _workers(pid: int) -> list[int]:
    """A supervisor's workers (``[server] workers``): its children serving with --worker-fd."""
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # The command name is in parentheses and may hold anything: the fields follow the last.
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(pid) and b"--worker-fd" in argv:
            found.append(int(entry.name))
    return sorted(found)


def _status_place(pid: int) -> tuple[Path, int] | None:
    """Where process ``pid`` keeps its reload status, from its own environment and user."""
    try:
        uid = (PROC / str(pid)).stat().st_uid
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    environ = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, _, v in pairs}
    return status_dir(environ, uid), uid


class _Watch:
    """One serving process whose next reload outcome is awaited."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.place = _status_place(pid)
        before = self.read()
        self.reloads_before = before.reloads if before is not None else 0

    def read(self) -> ReloadStatus | None:
        if self.place is None:
            return None
        directory, uid = self.place
        return read_status(directory, self.pid, uid)

    def outcome(self) -> ReloadStatus | None:
        status = self.read()
        return status if status is not None and status.reloads > self.reloads_before else None


def wait_for_outcomes(watches: list[_Watch], timeout_s: float) -> int:
    """Print what each process made of the reload; the exit status."""
    deadline = time.monotonic() + timeout_s
    pending = list(watches)
    failed = False
    while pending:
        for watch in list(pending):
            status = watch.outcome()
            if status is None:
                continue
            pending.remove(watch)
            if status.applied:
                print(f"pid {watch.pid}: reload applied: {status.summary}")
                continue
            failed = True
            for problem in status.problems:
                print(f"pid {watch.pid}: {problem}", file=sys.stderr)
            print(f"pid {watch.pid}: reload rejected; nothing changed", file=sys.stderr)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    for watch in pending:
        failed = True
        print(
            f"trio-gateway reload: pid {watch.pid}: no outcome within {timeout_s:g} s; the "
            "gateway's log says what became of it (`reload: ...`)",
            file=sys.stderr,
        )
    return 1 if failed else 0


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
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"how long to wait for the outcome (default: {DEFAULT_TIMEOUT_S:g}; 0: do not wait)",
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
    watches: list[_Watch] = []
    for pid in pids:
        # Read before the signal: an outcome counts once the count in it has moved on.
        watching = [_Watch(p) for p in _workers(pid) or [pid]]
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError as exc:
            print(f"trio-gateway reload: pid {pid}: {exc.strerror or exc}", file=sys.stderr)
            failed = True
        else:
            print(f"sent SIGHUP to pid {pid}")
            watches += watching
    if args.timeout <= 0:
        return 1 if failed else 0
    waited = wait_for_outcomes(watches, args.timeout)
    return 1 if failed or waited else 0
