"""``trio-gateway serve | check | sim``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from functools import partial

import trio

from trio_gateway.cli_keys import keys_main
from trio_gateway.cli_usage import usage_main
from trio_gateway.config import DEFAULT_CONFIG_NAME, ConfigError, GatewayConfig, load_config
from trio_gateway.server import serve_gateway
from trio_gateway.sim import sim_main

EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trio-gateway", description="An LLM gateway on trio.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the gateway")
    serve.add_argument(
        "--config", default=DEFAULT_CONFIG_NAME, help="config file (default: ./gateway.toml)"
    )
    serve.add_argument("--log-level", default="INFO")
    check = commands.add_parser("check", help="validate a config file without serving")
    check.add_argument("file", nargs="?", default=DEFAULT_CONFIG_NAME)
    commands.add_parser("sim", help="run the vLLM simulator (see: trio-gateway sim --help)")
    commands.add_parser("keys", help="create and list API keys (see: trio-gateway keys --help)")
    commands.add_parser("usage", help="usage records from the ledger (see: --help)")
    return parser


def _load(path: str) -> GatewayConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{exc.source}: {problem}", file=sys.stderr)
        print(f"{exc.source}: {len(exc.problems)} problem(s); nothing started", file=sys.stderr)
        return None


async def _serve_until_signalled(config: GatewayConfig) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        first_signal = trio.Event()

        async def wait_first() -> None:
            await first_signal.wait()

        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                async for signum in signals:
                    if not first_signal.is_set():
                        logging.getLogger("trio_gateway").info(
                            "%s: draining for up to %g s",
                            signal.Signals(signum).name,
                            config.server.drain_timeout_s,
                        )
                        first_signal.set()
                    else:
                        nursery.cancel_scope.cancel(reason="second signal")

            nursery.start_soon(watch_signals)
            await serve_gateway(config, shutdown_trigger=wait_first)
            nursery.cancel_scope.cancel()


def _leaves(group: BaseExceptionGroup[OSError]) -> list[OSError]:
    """The OSErrors inside nested nursery groups."""
    out: list[OSError] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["sim"]:
        return sim_main(args_in[1:])
    if args_in[:1] == ["keys"]:
        return keys_main(args_in[1:])
    if args_in[:1] == ["usage"]:
        return usage_main(args_in[1:])
    args = _parser().parse_args(args_in)
    if args.command == "check":
        config = _load(args.file)
        if config is None:
            return EXIT_CONFIG
        print(
            f"{args.file}: ok ({len(config.aliases)} aliases, {len(config.providers())} providers)"
        )
        return 0
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per upstream request is noise at INFO; the gateway logs what matters.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = _load(args.config)
    if config is None:
        return EXIT_CONFIG
    failed = False
    try:
        trio.run(partial(_serve_until_signalled, config))
    except* OSError as group:
        # A port in use, an address not on this host: say so, without a traceback.
        for exc in _leaves(group):
            print(f"trio-gateway: cannot serve: {exc}", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
