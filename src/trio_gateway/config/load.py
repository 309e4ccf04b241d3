"""Reading gateway.toml: strict structure (cattrs), then every semantic problem at once."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
import tomli
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, override

from trio_gateway.config.checks import (
    budget_warnings,
    raw_secret_problems,
    semantic_problems,
    unused_key_warnings,
)
from trio_gateway.config.schema import (
    FILTER_FIELDS,
    MESSAGES_WITHOUT_THINKING,
    PROVIDER_PATH_KEYS,
    PROVIDER_TYPES,
    ROUTINGS,
    BuiltinTools,
    ConfigError,
    FilterAction,
    FilterField,
    GatewayConfig,
    MessagesWithoutThinking,
    OnLeaseError,
    OnRedisError,
    OnSaturated,
    ProviderType,
    ReasoningOff,
    Routing,
    Secret,
    SimulatorConfig,
    UsageSinkKind,
    Workers,
)
from trio_gateway.core.capability import Capability
from trio_gateway.sim.config import SimConfig

# GatewayConfig's fields that load fills in, never the file (omitted from its structure hook).
_NOT_FROM_FILE = frozenset(
    {"api_keys", "seal_key", "tracing_headers", "source", "warnings", "listen_origin"}
)


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
        lambda t: t == BuiltinTools, _literal_hook(("drop", "refuse"), "builtin_tools")
    )
    converter.register_structure_hook_func(
        lambda t: t == MessagesWithoutThinking,
        _literal_hook(MESSAGES_WITHOUT_THINKING, "messages_without_thinking"),
    )
    converter.register_structure_hook_func(
        lambda t: t == UsageSinkKind, _literal_hook(("sqlite", "redis_stream", "none"), "sink")
    )

    def workers(value: object, _: type) -> Workers:
        if value == "auto":
            return "auto"
        if type(value) is not int:
            raise TypeError(f'expected a number of workers or "auto", got {value!r}')
        return value

    converter.register_structure_hook_func(lambda t: t == Workers, workers)

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
    converter.register_structure_hook_func(
        lambda t: t == FilterAction, _literal_hook(("mask", "block"), "action")
    )
    field_hook = _literal_hook(FILTER_FIELDS, "field")

    def filter_fields(value: object, _: type) -> tuple[FilterField, ...]:
        if not isinstance(value, list):
            raise TypeError(f"expected a list of fields, got {value!r}")
        return tuple(field_hook(v, str) for v in value)

    converter.register_structure_hook_func(lambda t: t == tuple[FilterField, ...], filter_fields)
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
    # What load fills in is not the file's to say: `source = "x"` is an unknown key.
    converter.register_structure_hook(
        GatewayConfig,
        make_dict_structure_fn(
            GatewayConfig,
            converter,
            api_keys=override(omit=True),
            seal_key=override(omit=True),
            tracing_headers=override(omit=True),
            source=override(omit=True),
            warnings=override(omit=True),
            listen_origin=override(omit=True),
        ),
    )
    return converter


_CONVERTER = _make_converter()


def _format_exception(exc: BaseException, type_: type | None) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, ForbiddenExtraKeysError):
        return f"unknown key{'s' if len(exc.extra_fields) > 1 else ''} " + ", ".join(
            _with_suggestion(k, exc.cl) for k in sorted(exc.extra_fields)
        )
    if isinstance(exc, TypeError | ValueError) and str(exc):
        return str(exc)
    return f"invalid value ({exc.__class__.__name__}: {exc})"


def _with_suggestion(key: str, table: type) -> str:
    """``'wieght' (did you mean 'weight'?)``, when a known key of the table is close."""
    known = [f.name for f in attrs.fields(table) if f.name not in _NOT_FROM_FILE]
    if table is SimConfig:
        known.append("listen")  # a [simulators.NAME] table's own key (simulator hook)
    close = difflib.get_close_matches(key, known, n=1)
    return f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key)


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
    base_dir: Path | None = None,
    secrets: bool = True,
) -> GatewayConfig:
    """Parse TOML text into a config, or raise :class:`ConfigError` listing every problem.

    ``listen`` (``serve --listen``) replaces ``server.listen`` before anything is checked, so
    the checks that depend on it (a non-loopback address needs ``[auth]``) see the real one.
    ``base_dir`` (the config file's directory) is where relative file paths are read from;
    without it, from the working directory. ``secrets=False``: for a command that reads
    records and never calls a provider, the providers' and the seal's variables are neither
    read nor required."""
    env: Mapping[str, str] | None = os.environ if environ is None else environ
    if not secrets:
        env = None
    try:
        raw = tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        raise ConfigError(source, [f"not valid TOML: {exc}"]) from None
    if base_dir is not None:
        resolve_paths(raw, base_dir)
    if listen is not None:
        server = raw.setdefault("server", {})
        if isinstance(server, dict):
            server["listen"] = listen
    reference_problems, references = resolve_references(raw)
    config, problems = _structural_problems(raw)
    if config is None or reference_problems:
        # Value checks need the types right; missing secrets do not, and are worth knowing now.
        # A reference's copy of its provider would repeat the definition's problems.
        found = problems + (raw_secret_problems(raw, env) if env is not None else [])
        raise ConfigError(source, reference_problems + _outside(found, references))
    if listen is not None:
        config = attrs.evolve(config, listen_origin="--listen")
    problems = semantic_problems(config, env)
    if problems:
        raise ConfigError(source, problems)
    keys = {
        p.name: Secret(env[p.api_key_env])
        for p in config.providers().values()
        if p.api_key_env is not None and env is not None
    }
    warnings = tuple(unused_key_warnings(raw)) + tuple(budget_warnings(config))
    seal_env = config.responses.seal_key_env
    seal_key = Secret(env[seal_env]) if seal_env is not None and env is not None else None
    tracing = config.tracing
    headers = (
        {}
        if tracing is None or env is None
        else {h: Secret(env[v]) for h, v in tracing.headers.items()}
    )
    return attrs.evolve(
        config,
        api_keys=keys,
        seal_key=seal_key,
        tracing_headers=headers,
        source=source,
        warnings=warnings,
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ConfigError(str(path), ["is a directory, not a config file"]) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(str(path), [f"cannot read {path.absolute()}: {reason}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text: {exc}"]) from None


def load_config(
    path: str | Path,
    *,
    environ: Mapping[str, str] | None = None,
    listen: str | None = None,
    secrets: bool = True,
) -> GatewayConfig:
    path = Path(path)
    text = _read(path)
    base_dir = path.absolute().parent
    return parse_config(
        text, source=str(path), environ=environ, listen=listen, base_dir=base_dir, secrets=secrets
    )


def resolve_references(raw: dict[str, Any]) -> tuple[list[str], list[str]]:
    """An alias's ``providers`` may name a provider defined in another alias (``providers =
    ["vllm-local"]``): the same provider, its gate shared, defined once, so that changing it
    is one edit. Each name is replaced, in place, with a copy of its definition (a table in
    another alias's list). Returns the problems (a name no alias defines) and the dotted
    paths of every reference."""
    aliases = raw.get("aliases")
    if not isinstance(aliases, dict):
        return [], []
    lists = {
        name: alias["providers"]
        for name, alias in aliases.items()
        if isinstance(alias, dict) and isinstance(alias.get("providers"), list)
    }
    defined: dict[str, dict[str, Any]] = {}
    for providers in lists.values():
        for provider in providers:
            if isinstance(provider, dict) and isinstance(provider.get("name"), str):
                defined.setdefault(provider["name"], provider)
    problems: list[str] = []
    references: list[str] = []
    for alias_name, providers in lists.items():
        for i, provider in enumerate(providers):
            if not isinstance(provider, str):
                continue
            where = f"aliases.{alias_name}.providers[{i}]"
            references.append(where)
            if provider in defined:
                providers[i] = dict(defined[provider])
            else:
                known = ", ".join(defined) or "none"
                problems.append(
                    f"{where}: no alias defines a provider named {provider!r} (defined: {known})"
                )
    return problems, references


def _outside(problems: list[str], paths: list[str]) -> list[str]:
    """The problems not about anything under ``paths``."""
    return [
        p
        for p in problems
        if not any(
            p.startswith(path) and p[len(path) : len(path) + 1] in (".", ":", "[") for path in paths
        )
    ]


# Values that are not files: the ledger's "none" and ":memory:" (accounting/ledger.py), and
# an empty string, which the value checks refuse.
_NOT_FILES = ("", "none", ":memory:")


def resolve_paths(raw: dict[str, Any], base_dir: Path) -> None:
    """Make every file path of a config's TOML (``auth.keys_file``, ``usage.ledger``,
    ``redis.ca_file``, and a provider's ``PROVIDER_PATH_KEYS``) absolute, a relative one taken
    from ``base_dir``, in place: a config means the same files whatever the working directory
    of the command reading it, and every message names the file it tried. A value of the
    wrong type is left for the structure's check to name."""

    def resolve(table: object, key: str) -> None:
        value = table.get(key) if isinstance(table, dict) else None
        if isinstance(table, dict) and isinstance(value, str) and value not in _NOT_FILES:
            path = Path(value).expanduser()
            table[key] = str(path if path.is_absolute() else base_dir / path)

    resolve(raw.get("auth"), "keys_file")
    resolve(raw.get("usage"), "ledger")
    resolve(raw.get("redis"), "ca_file")
    aliases = raw.get("aliases")
    for alias in aliases.values() if isinstance(aliases, dict) else ():
        providers = alias.get("providers") if isinstance(alias, dict) else None
        for provider in providers if isinstance(providers, list) else ():
            for key in PROVIDER_PATH_KEYS:
                resolve(provider, key)


def parse_hostport(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


@attrs.frozen
class ConfigOutline:
    """What the key commands need of a config: its aliases and its keys file (absolute)."""

    source: str
    aliases: tuple[str, ...]
    keys_file: str | None


def outline_config(path: str | Path) -> ConfigOutline:
    """A config's aliases and keys file, read without the checks that need the environment
    it serves in (its credentials, its variables): ``keys new`` and ``keys list`` run in an
    operator's shell. :class:`ConfigError` when the file cannot be read, is not TOML, or
    has no aliases."""
    path = Path(path)
    try:
        raw = tomli.loads(_read(path))
    except tomli.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"not valid TOML: {exc}"]) from None
    resolve_paths(raw, path.absolute().parent)
    aliases = raw.get("aliases")
    if not isinstance(aliases, dict) or not aliases:
        raise ConfigError(str(path), ["aliases: at least one alias is needed"])
    auth = raw.get("auth")
    keys_file = auth.get("keys_file") if isinstance(auth, dict) else None
    return ConfigOutline(
        source=str(path),
        aliases=tuple(aliases),
        keys_file=keys_file if isinstance(keys_file, str) else None,
    )
