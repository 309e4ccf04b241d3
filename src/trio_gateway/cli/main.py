"""``trio-gateway serve | check | init | reload | stop | sim | keys | usage``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from importlib.resources import files
from pathlib import Path

import trio

from trio_gateway import __version__
from trio_gateway.cli.keys import keys_main
from trio_gateway.cli.reload import reload_main
from trio_gateway.cli.stop import stop_main
from trio_gateway.cli.usage import usage_main
from trio_gateway.config.load import load_config
from trio_gateway.config.schema import DEFAULT_CONFIG_NAME, ConfigError, GatewayConfig
from trio_gateway.core.words import counted
from trio_gateway.ops.log_queue import configure_logging
from trio_gateway.ops.sd_notify import notify, reloading
from trio_gateway.process.cores import resolve_workers
from trio_gateway.process.descriptors import raise_descriptor_limit
from trio_gateway.process.reload_status import StatusFile
from trio_gateway.process.reloader import LoadConfig, ReloadOutcome
from trio_gateway.process.serve import GatewayHandle, freeze_start_up, serve_gateway
from trio_gateway.process.workers import second_signal_hint, serve_workers
from trio_gateway.sim import sim_main

EXIT_CONFIG = 2
# A command whose output's reader left (a pipe closed early): 128 + SIGPIPE, as a shell reports
# any tool that signal ended, so `set -o pipefail` scripts see what `head` did to it.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# The starter config `init` writes: the embedded-simulator default, the same as the repository's
# gateway.toml (a test keeps the two identical).
STARTER_CONFIG = "default_gateway.toml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trio-gateway", description="An LLM gateway on trio.")
    parser.add_argument("--version", action="version", version=f"trio-gateway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the gateway")
    serve.add_argument(
        "--config", default=DEFAULT_CONFIG_NAME, help="config file (default: ./gateway.toml)"
    )
    serve.add_argument(
        "--listen", metavar="HOST:PORT", help="listen here instead of the config's server.listen"
    )
    serve.add_argument(
        "--log-level", default="info", type=str.lower, choices=LOG_LEVELS, help="default: info"
    )
    # A worker's inherited listening socket, supervisor pipe and host broker socket
    # (workers.py), not for users.
    serve.add_argument("--worker-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--lifeline-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--broker-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--worker-count", type=int, default=1, help=argparse.SUPPRESS)
    serve.add_argument(
        "--log-format",
        default="text",
        choices=("text", "json"),
        help="text lines, or JSON lines for log shippers (default: text)",
    )
    check = commands.add_parser(
        "check",
        help="validate a config file without serving",
        description="Read a config file as `serve` would, and report every problem at once "
        "(exit status 2), or `ok` and what it defines. Keys that do nothing are warned about.",
    )
    check.add_argument(
        "file",
        nargs="?",
        default=DEFAULT_CONFIG_NAME,
        metavar="FILE",
        help="the config file (default: ./gateway.toml); the files it names are read, "
        "relative ones from its directory",
    )
    init = commands.add_parser(
        "init",
        help="write a starter gateway.toml (the built-in simulator default)",
        description="Write the starter config: the built-in vLLM simulator behind two aliases, "
        "open to this machine only. `trio-gateway serve` then serves it.",
    )
    init.add_argument(
        "path",
        nargs="?",
        default=DEFAULT_CONFIG_NAME,
        metavar="PATH",
        help="the file to write (default: ./gateway.toml); an existing directory gets "
        "PATH/gateway.toml",
    )
    init.add_argument("--force", action="store_true", help="replace an existing file")
    commands.add_parser("sim", help="run the vLLM simulator (see: trio-gateway sim --help)")
    commands.add_parser("keys", help="create and list API keys (see: trio-gateway keys --help)")
    commands.add_parser("usage", help="usage records from the ledger (see: --help)")
    commands.add_parser(
        "reload", help="check the config, then make the running gateway reload it (see: --help)"
    )
    commands.add_parser(
        "stop", help="make the gateways serving a config drain and exit (see: --help)"
    )
    return parser


def _load(path: str, listen: str | None = None) -> GatewayConfig | None:
    try:
        return load_config(path, listen=listen)
    except ConfigError as exc:
        if path == DEFAULT_CONFIG_NAME and not Path(path).exists():
            print(
                f"trio-gateway: no {path} here; write one with `trio-gateway init` "
                "(the built-in simulator default), or give --config PATH",
                file=sys.stderr,
            )
            return None
        for problem in exc.problems:
            print(f"{exc.source}: {problem}", file=sys.stderr)
        print(f"{exc.source}: {len(exc.problems)} problem(s); nothing started", file=sys.stderr)
        return None


async def _serve_until_signalled(
    config: GatewayConfig,
    load: LoadConfig,
    worker: tuple[int, int, int] | None = None,
    workers: int = 1,
) -> None:
    """SIGTERM or SIGINT: drain, a second one stops at once. SIGHUP: reload the config file
    (and the keys file); a bad file changes nothing (reloader.py). A ``worker`` (workers.py)
    serves the socket its supervisor passed, and drains when the supervisor is gone."""
    log = logging.getLogger("trio_gateway")
    raise_descriptor_limit(config)
    status = StatusFile()
    with (
        trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals,
        _removed_at_exit(status),
    ):
        first_signal = trio.Event()

        async def wait_first() -> None:
            await first_signal.wait()

        async with trio.open_nursery() as nursery:
            inherited = host_broker = None
            if worker is not None:
                inherited = socket.socket(fileno=worker[0])
                nursery.start_soon(_watch_lifeline, worker[1], first_signal)
                host_broker = socket.socket(fileno=worker[2])

            async def serve(*, task_status: trio.TaskStatus[GatewayHandle]) -> None:
                await serve_gateway(
                    config,
                    shutdown_trigger=wait_first,
                    load=load,
                    inherited=inherited,
                    simulators=worker is None,
                    host_broker=host_broker,
                    workers=workers,
                    task_status=task_status,
                )
                nursery.cancel_scope.cancel()

            handle: GatewayHandle = await nursery.start(serve)
            freeze_start_up()
            # A worker's supervisor speaks for it to systemd (its environment has no socket).
            notify(f"READY=1\nSTATUS=serving on {handle.base_url}")
            # Where `trio-gateway reload` reads what became of the SIGHUP it sent.
            await status.write(None, (), "serving")

            async def said(outcome: ReloadOutcome) -> None:
                await status.write(outcome.applied, outcome.problems, outcome.summary)

            handle.reloader.on_outcome = said

            async def reload() -> None:
                notify(reloading())
                applied = await handle.reload()
                result = "applied" if applied else "rejected, nothing changed"
                notify(f"READY=1\nSTATUS=serving on {handle.base_url}; last reload {result}")

            async for signum in signals:
                if signum == signal.SIGHUP:
                    log.info("SIGHUP: reloading %s", config.source)
                    nursery.start_soon(reload)
                elif not first_signal.is_set():
                    log.info(
                        "%s: draining for up to %g s (%s stops at once)",
                        signal.Signals(signum).name,
                        config.server.drain_timeout_s,
                        second_signal_hint(signum),
                    )
                    notify("STOPPING=1\nSTATUS=draining")
                    first_signal.set()
                else:
                    log.warning("%s again: stopping at once", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel(reason="second signal")


@contextmanager
def _removed_at_exit(status: StatusFile) -> Iterator[None]:
    try:
        yield
    finally:
        status.remove()


async def _watch_lifeline(fd: int, stop: trio.Event) -> None:
    """EOF on the supervisor's pipe: it is gone (even by kill -9); drain and end."""
    stream = trio.lowlevel.FdStream(fd)
    while await stream.receive_some(1024):
        pass
    logging.getLogger("trio_gateway").warning("supervisor gone: draining")
    stop.set()


def _leaves(group: BaseExceptionGroup[OSError]) -> list[OSError]:
    """The OSErrors inside nested nursery groups."""
    out: list[OSError] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def _init(given: str, *, force: bool) -> int:
    path = Path(given)
    # A directory (or a name ending in /, as a directory is typed) gets its gateway.toml.
    if path.is_dir() or given.endswith("/"):
        path = path / DEFAULT_CONFIG_NAME
    if path.is_dir():
        print(f"trio-gateway: {path} is a directory; give a file name", file=sys.stderr)
        return 1
    if path.exists() and not force:
        print(f"trio-gateway: {path} exists; keeping it (--force replaces it)", file=sys.stderr)
        return 1
    text = files("trio_gateway").joinpath(STARTER_CONFIG).read_text(encoding="utf-8")
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"trio-gateway: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}: serve it with `trio-gateway serve --config {path}`")
    return 0


def _serve_argv(args: argparse.Namespace) -> list[str]:
    """The supervisor's ``serve`` arguments, for its workers."""
    argv = ["serve", "--config", args.config, "--log-level", args.log_level]
    argv += ["--log-format", args.log_format]
    return argv + (["--listen", args.listen] if args.listen else [])


def main(argv: list[str] | None = None) -> int:
    """Every command; one whose reader closes the pipe early (``trio-gateway usage --json |
    head -3``) stops there, quietly, with the status a shell gives a tool SIGPIPE ended."""
    try:
        try:
            status = _command(argv)
        finally:
            # Here, not as the interpreter exits (a closed pipe is then a warning on stderr);
            # after argparse's --help and --version (a SystemExit) too.
            sys.stdout.flush()
    except BrokenPipeError:
        _drop_output()
        return EXIT_BROKEN_PIPE
    return status


def _drop_output() -> None:
    """What is still buffered for stdout or stderr goes nowhere: the interpreter flushes both
    as it exits, and a write to the closed pipe would fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        # ValueError, OSError: no file behind the stream (replaced, or closed).
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)


def _command(argv: list[str] | None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["sim"]:
        return sim_main(args_in[1:])
    if args_in[:1] == ["keys"]:
        return keys_main(args_in[1:])
    if args_in[:1] == ["usage"]:
        return usage_main(args_in[1:])
    if args_in[:1] == ["reload"]:
        return reload_main(args_in[1:])
    if args_in[:1] == ["stop"]:
        return stop_main(args_in[1:])
    args = _parser().parse_args(args_in)
    if args.command == "init":
        return _init(args.path, force=args.force)
    if args.command == "check":
        config = _load(args.file)
        if config is None:
            return EXIT_CONFIG
        for warning in config.warnings:
            print(f"{args.file}: warning: {warning}", file=sys.stderr)
        aliases = counted(len(config.aliases), "alias", "aliases")
        print(f"{args.file}: ok ({aliases}, {counted(len(config.providers()), 'provider')})")
        return 0
    with configure_logging(args.log_level, args.log_format):
        config = _load(args.config, args.listen)
        if config is None:
            return EXIT_CONFIG
        problems = _serve(args, config)
    # Printed once the log's last lines are out (the queue is written out as it closes), so
    # the reason the gateway stopped comes last.
    for problem in problems:
        print(f"trio-gateway: cannot serve: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _serve(args: argparse.Namespace, config: GatewayConfig) -> list[OSError]:
    """Serve until stopped; the addresses that could not be served (a port in use, an
    address not on this host), to be said without a traceback."""
    load = partial(load_config, args.config, listen=args.listen)
    problems: list[OSError] = []
    try:
        workers = resolve_workers(config.server.workers)
        if args.worker_fd is not None:
            worker = (args.worker_fd, args.lifeline_fd, args.broker_fd)
            trio.run(partial(_serve_until_signalled, config, load, worker, args.worker_count))
        elif workers > 1:
            trio.run(serve_workers, config, _serve_argv(args), workers)
        else:
            trio.run(partial(_serve_until_signalled, config, load))
    except* OSError as group:
        problems = _leaves(group)
    return problems


if __name__ == "__main__":
    sys.exit(main())
