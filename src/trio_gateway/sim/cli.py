"""`trio-gateway sim ...` / `python -m trio_gateway.sim ...`: one flag per `SimConfig` field."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from functools import partial
from typing import Any

import attrs
import trio

from .config import DIALECTS, RUNNERS, SCHEDULING_POLICIES, SimConfig
from .server import serve_sim

__all__ = ["build_parser", "parse_args", "sim_main"]

DEFAULT_LISTEN = "127.0.0.1:8000"
_TITLES = {"vllm": "vLLM", "openai": "OpenAI", "anthropic": "Anthropic", "gemini": "Gemini"}
# What to paste as the SDK's base_url: OpenAI-style clients want /v1, the others the root.
_PATHS = {"vllm": "/v1", "openai": "/v1", "anthropic": "", "gemini": ""}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trio-gateway sim",
        description=(
            "A simulated LLM server: vLLM 0.32.0's OpenAI-compatible dialect by default, or "
            "OpenAI, Anthropic or Gemini (--dialect)."
        ),
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (port 0: any free port; default {DEFAULT_LISTEN})",
    )
    for field in attrs.fields(SimConfig):
        default = field.default
        secret = field.name in ("api_key", "oauth_public_key_pem")
        help_text = "default: none" if secret else f"default: {default!r}"
        # Unset flags stay out of the namespace, so SimConfig's own defaults apply.
        common: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": field.name}
        if isinstance(default, bool):
            parser.add_argument(
                _flag(field.name), action=argparse.BooleanOptionalAction, help=help_text, **common
            )
        elif field.name == "dialect":
            parser.add_argument(_flag(field.name), choices=DIALECTS, help=help_text, **common)
        elif field.name == "runner":
            parser.add_argument(_flag(field.name), choices=RUNNERS, help=help_text, **common)
        elif field.name == "scheduling_policy":
            parser.add_argument(
                _flag(field.name), choices=SCHEDULING_POLICIES, help=help_text, **common
            )
        elif isinstance(default, int | float):
            parser.add_argument(_flag(field.name), type=type(default), help=help_text, **common)
        else:
            parser.add_argument(_flag(field.name), type=str, help=help_text, **common)
    return parser


def _split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def parse_args(argv: list[str]) -> tuple[SimConfig, str, int]:
    """argv (without the program name) to a config and the address to listen on. Exits
    through argparse (status 2) on bad flags, like every CLI."""
    parser = build_parser()
    namespace = vars(parser.parse_args(argv))
    listen = namespace.pop("listen")
    try:
        host, port = _split_listen(listen)
        config = SimConfig(**namespace)
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    return config, host, port


async def _run(config: SimConfig, host: str, port: int) -> None:
    # SIGTERM (docker stop, systemd, a test harness) ends the server like Ctrl-C does.
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(partial(serve_sim, config, host=host, port=port))
            print(
                f"{_TITLES[config.dialect]} simulator serving {config.served_model_name!r} "
                f"on {handle.base_url}{_PATHS[config.dialect]}",
                flush=True,
            )
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def sim_main(argv: list[str]) -> int:
    config, host, port = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if config.access_log else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    # Ctrl-C is how a standalone simulator is meant to stop.
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(_run, config, host, port)
    return 0
