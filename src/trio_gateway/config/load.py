"""Reading gateway.toml: strict structure (cattrs), then every semantic problem at once."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
import tomli
from cattrs.errors import ForbiddenExtraKeysError

from trio_gateway.config.checks import raw_secret_problems, semantic_problems
from trio_gateway.config.schema import (
    PROVIDER_TYPES,
    ROUTINGS,
    ConfigError,
    GatewayConfig,
    OnLeaseError,
    OnRedisError,
    OnSaturated,
    ProviderType,
    ReasoningOff,
    Routing,
    Secret,
    SimulatorConfig,
    UsageSinkKind,
)
from trio_gateway.core.capability import Capability
from trio_gateway.sim.config import SimConfig


def _strict_int(value: object, _: type) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _strict_float(value: object, _: type) -> float:
    if type(value) not in (int, float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _strict_str(value: object, _: type) -> str:
    if type(value) is not str:
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _strict_bool(value: object, _: type) -> bool:
    if type(value) is not bool:
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _capability(value: object, _: type) -> Capability:
    try:
        return Capability(value)
    except ValueError:
        known = ", ".join(c.value for c in Capability)
        raise ValueError(f"unknown capability {value!r} (known: {known})") from None


def _literal_hook(choices: tuple[str, ...], what: str) -> Any:
    def hook(value: object, _: type) -> str:
        if value not in choices:
            raise ValueError(f"unknown {what} {value!r} (known: {', '.join(choices)})")
        return value

    return hook


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(int, _strict_int)
    converter.register_structure_hook(float, _strict_float)
    converter.register_structure_hook(str, _strict_str)
    converter.register_structure_hook(bool, _strict_bool)
    converter.register_structure_hook(Capability, _capability)
    # Literal types are not classes: they are matched by predicate.
    converter.register_structure_hook_func(
        lambda t: t == ProviderType, _literal_hook(PROVIDER_TYPES, "provider type")
    )
    converter.register_structure_hook_func(
        lambda t: t == OnSaturated, _literal_hook(("spill", "queue"), "policy")
    )
    converter.register_structure_hook_func(
        lambda t: t == Routing, _literal_hook(ROUTINGS, "routing policy")
    )
    converter.register_structure_hook_func(
        lambda t: t == OnRedisError, _literal_hook(("fail_open", "fail_closed"), "policy")
    )
    converter.register_structure_hook_func(
        lambda t: t == OnLeaseError, _literal_hook(("share", "refuse"), "policy")
    )
    converter.register_structure_hook_func(
        lambda t: t == ReasoningOff, _literal_hook(("refuse", "lowest"), "reasoning_off")
    )
    converter.register_structure_hook_func(
        lambda t: t == UsageSinkKind, _literal_hook(("sqlite", "redis_stream", "none"), "sink")
    )

    def tuple_of_str(value: object, _: type) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise TypeError(f"expected a list of strings, got {value!r}")
        return tuple(_strict_str(v, str) for v in value)

    def capability_set(value: object, _: type) -> frozenset[Capability]:
        # A bare string is iterable too: without this, "tools" would read as t, o, o, l, s.
        if not isinstance(value, list):
            raise TypeError(f"expected a list of capabilities, got {value!r}")
        return frozenset(_capability(v, Capability) for v in value)

    converter.register_structure_hook_func(lambda t: t == tuple[str, ...], tuple_of_str)
    converter.register_structure_hook_func(lambda t: t == frozenset[Capability], capability_set)

    def simulator(value: object, _: type) -> SimulatorConfig:
        if not isinstance(value, dict):
            raise TypeError(f"expected a table, got {value!r}")
        rest = dict(value)
        listen = rest.pop("listen", None)
        sim = converter.structure(rest, SimConfig)
        if listen is None:
            raise ValueError("required field 'listen' is missing")
        return SimulatorConfig(listen=_strict_str(listen, str), sim=sim)

    converter.register_structure_hook(SimulatorConfig, simulator)
    return converter


_CONVERTER = _make_converter()


def _format_exception(exc: BaseException, type_: type | None) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, ForbiddenExtraKeysError):
        return f"unknown key{'s' if len(exc.extra_fields) > 1 else ''} " + ", ".join(
            repr(k) for k in sorted(exc.extra_fields)
        )
    if isinstance(exc, TypeError | ValueError) and str(exc):
        return str(exc)
    return f"invalid value ({exc.__class__.__name__}: {exc})"


_PATH_KEY = re.compile(r"\['([^']*)'\]")


def _dotted(path: str) -> str:
    """``$.aliases['agent-lite'].providers[0]`` → ``aliases.agent-lite.providers[0]``."""
    path = _PATH_KEY.sub(lambda m: "." + m.group(1), path)
    return path.removeprefix("$").removeprefix(".") or "(top level)"


def _structural_problems(raw: dict[str, Any]) -> tuple[GatewayConfig | None, list[str]]:
    try:
        return _CONVERTER.structure(raw, GatewayConfig), []
    except Exception as exc:
        problems = []
        for message in cattrs.transform_error(exc, path="$", format_exception=_format_exception):
            text, _, path = message.rpartition(" @ ")
            problems.append(f"{_dotted(path)}: {text}")
        return None, problems


def parse_config(
    text: str,
    *,
    source: str = "<config>",
    environ: Mapping[str, str] | None = None,
    listen: str | None = None,
) -> GatewayConfig:
    """Parse TOML text into a config, or raise :class:`ConfigError` listing every problem.

    ``listen`` (``serve --listen``) replaces ``server.listen`` before anything is checked, so
    the checks that depend on it (a non-loopback address needs ``[auth]``) see the real one."""
    env = os.environ if environ is None else environ
    try:
        raw = tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        raise ConfigError(source, [f"not valid TOML: {exc}"]) from None
    if listen is not None:
        server = raw.setdefault("server", {})
        if isinstance(server, dict):
            server["listen"] = listen
    config, problems = _structural_problems(raw)
    if config is None:
        # Value checks need the types right; missing secrets do not, and are worth knowing now.
        raise ConfigError(source, problems + raw_secret_problems(raw, env))
    problems = semantic_problems(config, env)
    if problems:
        raise ConfigError(source, problems)
    keys = {
        p.name: Secret(env[p.api_key_env])
        for p in config.providers().values()
        if p.api_key_env is not None
    }
    return attrs.evolve(config, api_keys=keys, source=source)


def load_config(
    path: str | Path, *, environ: Mapping[str, str] | None = None, listen: str | None = None
) -> GatewayConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text: {exc}"]) from None
    return parse_config(text, source=str(path), environ=environ, listen=listen)


def parse_hostport(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)
