"""``gateway.toml``: frozen attrs classes read through one strict cattrs converter.

Strict means: unknown keys, wrong types (``"8"`` is not 8, ``true`` is not 1) and missing fields are
errors, and every problem in a file is reported at once, each with its dotted path.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs
import tomli
from cattrs.errors import ForbiddenExtraKeysError

from trio_gateway.auth import KeysFileError, load_keys
from trio_gateway.redis_url import parse_redis_url
from trio_gateway.sim.config import SimConfig

DEFAULT_CONFIG_NAME = "gateway.toml"


class Capability(enum.Enum):
    TOOLS = "tools"
    VISION = "vision"
    JSON_SCHEMA = "json_schema"
    REASONING = "reasoning"


ProviderType = Literal["openai_compatible", "openai", "anthropic", "gemini", "vertex"]
PROVIDER_TYPES: tuple[str, ...] = ("openai_compatible", "openai", "anthropic", "gemini", "vertex")
# Each vendor's public endpoint, as its own SDK spells it (paths are appended by the dialect).
DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
    "vertex": "https://{location}-aiplatform.googleapis.com",
}
OnSaturated = Literal["spill", "queue"]
Routing = Literal["round_robin", "least_loaded", "affinity"]
ROUTINGS: tuple[str, ...] = ("round_robin", "least_loaded", "affinity")
OnRedisError = Literal["fail_open", "fail_closed"]
OnLeaseError = Literal["share", "refuse"]
# Worker processes of one `serve`: a bound on what one mistyped number starts.
MAX_WORKERS = 64
UsageSinkKind = Literal["sqlite", "redis_stream", "none"]


@attrs.frozen
class Secret:
    """A credential; its repr never shows the value."""

    value: str = attrs.field(repr=False)

    def __repr__(self) -> str:
        return "<SECRET>"


@attrs.frozen(kw_only=True)
class ServerConfig:
    listen: str = "127.0.0.1:8080"
    max_body_bytes: int = 4 * 1024 * 1024
    # Events buffered between the upstream reader and the client writer, per request.
    stream_buffer_events: int = 64
    client_stall_timeout_s: float = 30.0
    drain_timeout_s: float = 30.0
    # Processes serving one listening socket, each a whole gateway (docs/deployment.md).
    # Without [redis], each takes max_inflight // workers of every provider's slots.
    workers: int = 1


@attrs.frozen(kw_only=True)
class WebSocketConfig:
    """``GET /v1/ws`` limits (docs/events.md)."""

    # Sockets open at once on this gateway; one more is refused at the handshake (HTTP 403).
    max_sockets: int = 1000
    max_message_bytes: int = 4 * 1024 * 1024
    max_requests_per_socket: int = 16
    # Events waiting to be written; a client that lets more pile up is closed (4001).
    max_queued_events: int = 1024
    ping_interval_s: float = 20.0
    ping_timeout_s: float = 20.0


@attrs.frozen(kw_only=True)
class AuthConfig:
    """``[auth]``: API keys from ``keys_file``, or ``open = true`` for none (docs/accounting.md).

    Neither given: open on a loopback ``listen`` only (a config error elsewhere)."""

    keys_file: str | None = None
    open: bool | None = None


@attrs.frozen(kw_only=True)
class ProviderConfig:
    name: str
    type: ProviderType
    model: str
    # Optional for the cloud vendors: their public endpoint (DEFAULT_BASE_URLS); see ``endpoint``.
    base_url: str | None = None
    # openai_compatible only, in place of base_url: replicas of one served model, each with its
    # own max_inflight gate, health and probe (docs/routing.md); ``routing`` picks among them.
    endpoints: tuple[str, ...] = ()
    routing: Routing = "least_loaded"
    affinity_epsilon: float = 0.25  # bounded load: a replica above (1 + this) x the mean passes
    # How often a probed openai_compatible provider's /load and /metrics are read (the replica
    # signals least_loaded uses, and the prefix-cache hit rate on the gateway's /metrics).
    scrape_interval_s: float = 5.0
    # The credential: an API key (or, for vertex, a ready OAuth2 access token) from an
    # environment variable or a file; vertex may instead name a service-account JSON file.
    api_key_env: str | None = None
    api_key_file: str | None = None
    credentials_file: str | None = None
    # vertex only: where the model runs.
    project: str | None = None
    location: str | None = None
    # anthropic requires max_tokens on every request: this is sent when the client gave none.
    default_max_tokens: int = 4096
    max_inflight: int = 32
    queue_timeout_s: float = 1.0
    capabilities: frozenset[Capability] = frozenset()
    weight: int = 100
    strip_fields: tuple[str, ...] = ()
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 120.0
    idle_timeout_s: float = 60.0
    # Readiness: a real one-token generation, outside the gate.
    probe: bool = True
    probe_interval_s: float = 30.0
    probe_timeout_s: float = 15.0
    unhealthy_after: int = 3
    healthy_after: int = 2
    startup_grace_s: float = 600.0
    # Per million tokens, in the unit of the keys' budgets (docs/accounting.md#budgets).
    price_input_per_mtok: float = 0.0
    price_cached_input_per_mtok: float = 0.0
    price_output_per_mtok: float = 0.0

    @property
    def endpoint(self) -> str:
        """``base_url`` without a trailing slash, or the vendor's public endpoint."""
        if self.base_url is not None:
            return self.base_url.rstrip("/")
        if self.type == "vertex" and self.location == "global":
            # The global endpoint has no region in its host name.
            return "https://aiplatform.googleapis.com"
        default = DEFAULT_BASE_URLS.get(self.type, "")
        return default.format(location=self.location or "us-central1")


@attrs.frozen(kw_only=True)
class AliasConfig:
    providers: tuple[ProviderConfig, ...]
    # What a request does when every provider's gate is full: move on to the next provider
    # (weight-0 fallbacks included), or wait in the alias's bounded queue for the first choice.
    on_saturated: OnSaturated = "spill"
    max_queue_wait_s: float = 10.0
    max_queued: int = 100


@attrs.frozen(kw_only=True)
class SimulatorConfig:
    listen: str
    sim: SimConfig


@attrs.frozen(kw_only=True)
class UsageConfig:
    """``[usage]``: where each request's usage record goes (docs/accounting.md)."""

    # A SQLite file (a relative path is read from the config file's directory), or "none".
    # Unset: trio-gateway-usage.sqlite3 next to the config file (in memory for a config that
    # was not read from a file).
    ledger: str | None = None
    # Where records go: the SQLite ledger (default), a Redis Stream (needs [redis]), or nowhere.
    sink: UsageSinkKind = "sqlite"
    # redis_stream: the stream's name and its approximate length cap (XADD MAXLEN ~).
    stream: str = "trio-gateway:usage"
    stream_maxlen: int = 1_000_000
    # Records waiting to be written; past this, records are dropped (and counted), never waited on.
    queue_size: int = 10000
    batch_max: int = 500
    flush_interval_s: float = 1.0


@attrs.frozen(kw_only=True)
class RedisConfig:
    """``[redis]``: where budgets, holds and rate limits are shared between replicas."""

    url: str
    # Every Redis call's deadline: a request never waits on Redis longer than this.
    timeout_s: float = 0.25
    # What a request meets when Redis does not answer in time: served unlimited, or 503.
    on_error: OnRedisError = "fail_open"
    key_prefix: str = "tgw:"
    # Providers' max_inflight as leases every gateway process on this Redis shares (gate.py).
    leases: bool = True
    # A process that dies (kill -9 included) gives its slots back within this.
    lease_ttl_s: float = 10.0
    # Redis failing: each process takes its share of max_inflight (by the processes it last
    # saw), or admits nothing until Redis answers.
    on_lease_error: OnLeaseError = "share"


@attrs.frozen(kw_only=True)
class LimitsConfig:
    """``[limits]``: budget holds (docs/accounting.md#budgets)."""

    # A hold not settled by then (its replica died) stops counting against the budget.
    hold_ttl_s: float = 900.0


@attrs.frozen(kw_only=True)
class GatewayConfig:
    server: ServerConfig = ServerConfig()
    websocket: WebSocketConfig = WebSocketConfig()
    auth: AuthConfig = AuthConfig()
    aliases: dict[str, AliasConfig]
    simulators: dict[str, SimulatorConfig] = attrs.field(factory=dict)
    usage: UsageConfig = UsageConfig()
    redis: RedisConfig | None = None
    limits: LimitsConfig = LimitsConfig()
    # Not read from TOML: filled in by load, from the environment.
    api_keys: dict[str, Secret] = attrs.field(factory=dict)
    source: str = "<config>"

    def providers(self) -> dict[str, ProviderConfig]:
        """Every provider by name; aliases that name the same provider share it."""
        return {p.name: p for alias in self.aliases.values() for p in alias.providers}


class ConfigError(Exception):
    """Every problem found in one config file."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


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


def _parse_listen(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return f"expected HOST:PORT, got {value!r}"
    return None


def _endpoint_problems(where: str, p: ProviderConfig) -> list[str]:
    problems = []
    if p.type != "openai_compatible":
        problems.append(f"{where}.endpoints: only for type 'openai_compatible'")
    if p.base_url is not None:
        problems.append(f"{where}: give base_url or endpoints, not both")
    for i, url in enumerate(p.endpoints):
        if not re.match(r"^https?://[^/\s]+", url):
            problems.append(f"{where}.endpoints[{i}]: expected an http:// or https:// URL")
        elif url.rstrip("/") in (u.rstrip("/") for u in p.endpoints[:i]):
            problems.append(f"{where}.endpoints[{i}]: {url!r} is listed twice")
    return problems


def _provider_type_problems(where: str, p: ProviderConfig) -> list[str]:
    """What one provider's type requires, and what it does not take."""
    problems = []
    if p.endpoints:
        problems.extend(_endpoint_problems(where, p))
    elif p.base_url is None:
        if p.type == "openai_compatible":
            problems.append(f"{where}.base_url: required for type 'openai_compatible'")
    elif not re.match(r"^https?://[^/\s]+", p.base_url):
        problems.append(f"{where}.base_url: expected an http:// or https:// URL")
    if not p.endpoints and p.routing != "least_loaded":
        problems.append(f"{where}.routing: only for a provider with endpoints (replicas)")
    if p.affinity_epsilon <= 0:
        problems.append(f"{where}.affinity_epsilon: must be greater than 0")
    sources = [k for k in ("api_key_env", "api_key_file", "credentials_file") if getattr(p, k)]
    if len(sources) > 1:
        problems.append(f"{where}: give one of {', '.join(sources)}, not several")
    if p.credentials_file is not None and p.type != "vertex":
        problems.append(f"{where}.credentials_file: only for type 'vertex' (a service account)")
    if p.type in ("openai", "anthropic", "gemini", "vertex") and not sources:
        key = (
            "api_key_env, api_key_file or credentials_file"
            if p.type == "vertex"
            else ("api_key_env or api_key_file")
        )
        problems.append(f"{where}: type {p.type!r} needs a credential ({key})")
    for key in ("project", "location"):
        value = getattr(p, key)
        if p.type == "vertex" and not value:
            problems.append(f"{where}.{key}: required for type 'vertex'")
        elif p.type != "vertex" and value is not None:
            problems.append(f"{where}.{key}: only for type 'vertex'")
    if p.location is not None and not re.fullmatch(r"[a-z0-9-]+", p.location):
        problems.append(f"{where}.location: expected a region name like 'us-central1'")
    if p.default_max_tokens < 1:
        problems.append(f"{where}.default_max_tokens: must be at least 1")
    for key in ("api_key_file", "credentials_file"):
        path = getattr(p, key)
        if path is not None and (err := _credential_file_problem(path, key)) is not None:
            problems.append(f"{where}.{key}: {err}")
    return problems


def _credential_file_problem(path: str, key: str) -> str | None:
    """Whether a credential file can be used; the message never quotes its content."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    except UnicodeDecodeError:
        return f"{path} is not UTF-8 text"
    if not text.strip():
        return f"{path} is empty"
    if key == "credentials_file":
        try:
            account = json.loads(text)
        except ValueError:
            return f"{path} is not a service-account JSON file"
        missing = [
            k
            for k in ("client_email", "private_key")
            if not isinstance(account, dict) or not account.get(k)
        ]
        if missing:
            return f"{path} is not a service-account JSON file (no {', '.join(missing)})"
    return None


def is_loopback(listen: str) -> bool:
    """Whether ``HOST:PORT`` listens on this host only. A name other than ``localhost`` is not
    resolved and counts as reachable from elsewhere."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _auth_problems(config: GatewayConfig) -> list[str]:
    auth = config.auth
    if auth.keys_file is not None and auth.open is not None:
        return ["auth: give keys_file (keys required) or open (no keys), not both"]
    if auth.open is False:
        return ["auth.open: false requires keys; give keys_file = PATH instead"]
    if auth.keys_file is None and auth.open is None and not is_loopback(config.server.listen):
        return [
            f"auth: server.listen {config.server.listen!r} is not a loopback address, so callers "
            'need API keys: give [auth] keys_file = "PATH" (or open = true to serve without)'
        ]
    if auth.keys_file is not None:
        try:
            load_keys(auth.keys_file, known_aliases=config.aliases.keys())
        except KeysFileError as exc:
            return [f"auth.keys_file: {exc.source}: {problem}" for problem in exc.problems]
    return []


def _semantic_problems(config: GatewayConfig, environ: Mapping[str, str]) -> list[str]:
    problems: list[str] = []
    if (err := _parse_listen(config.server.listen)) is not None:
        problems.append(f"server.listen: {err}")
    else:
        problems.extend(_auth_problems(config))
    if not 1 <= config.server.workers <= MAX_WORKERS:
        problems.append(f"server.workers: must be from 1 to {MAX_WORKERS}")
    for key in ("max_body_bytes", "stream_buffer_events"):
        if getattr(config.server, key) < 1:
            problems.append(f"server.{key}: must be at least 1")
    for key in ("client_stall_timeout_s", "drain_timeout_s"):
        if getattr(config.server, key) <= 0:
            problems.append(f"server.{key}: must be greater than 0")
    for key in (
        "max_sockets",
        "max_message_bytes",
        "max_requests_per_socket",
        "max_queued_events",
    ):
        if getattr(config.websocket, key) < 1:
            problems.append(f"websocket.{key}: must be at least 1")
    for key in ("ping_interval_s", "ping_timeout_s"):
        if getattr(config.websocket, key) <= 0:
            problems.append(f"websocket.{key}: must be greater than 0")
    if not config.aliases:
        problems.append("aliases: at least one alias is needed")
    seen: dict[str, tuple[str, ProviderConfig]] = {}
    for alias_name, alias in config.aliases.items():
        if not alias.providers:
            problems.append(f"aliases.{alias_name}.providers: at least one provider is needed")
        if alias.max_queue_wait_s < 0:
            problems.append(f"aliases.{alias_name}.max_queue_wait_s: must be 0 or more")
        if alias.max_queued < 0:
            problems.append(f"aliases.{alias_name}.max_queued: must be 0 or more")
        names_here: set[str] = set()
        for i, p in enumerate(alias.providers):
            where = f"aliases.{alias_name}.providers[{i}]"
            if p.name in names_here:
                problems.append(f"{where}.name: duplicate provider name {p.name!r} in this alias")
            names_here.add(p.name)
            if p.name in seen and seen[p.name][1] != p:
                problems.append(
                    f"{where}.name: provider {p.name!r} is also defined, differently, at "
                    f"{seen[p.name][0]} (aliases that share a provider must define it the same)"
                )
            seen.setdefault(p.name, (where, p))
            problems.extend(_provider_type_problems(where, p))
            if p.max_inflight < 1:
                problems.append(f"{where}.max_inflight: must be at least 1")
            if p.weight < 0:
                problems.append(f"{where}.weight: must be 0 or more")
            if p.queue_timeout_s < 0:
                problems.append(f"{where}.queue_timeout_s: must be 0 or more")
            for key in (
                "connect_timeout_s",
                "first_token_timeout_s",
                "idle_timeout_s",
                "probe_interval_s",
                "probe_timeout_s",
                "scrape_interval_s",
            ):
                if getattr(p, key) <= 0:
                    problems.append(f"{where}.{key}: must be greater than 0")
            for key in ("unhealthy_after", "healthy_after"):
                if getattr(p, key) < 1:
                    problems.append(f"{where}.{key}: must be at least 1")
            if p.startup_grace_s < 0:
                problems.append(f"{where}.startup_grace_s: must be 0 or more")
            if p.api_key_env is not None and not environ.get(p.api_key_env):
                problems.append(
                    f"{where}.api_key_env: environment variable {p.api_key_env!r} is not set"
                )
    for sim_name, sim in config.simulators.items():
        if (err := _parse_listen(sim.listen)) is not None:
            problems.append(f"simulators.{sim_name}.listen: {err}")
    for key in ("queue_size", "batch_max"):
        if getattr(config.usage, key) < 1:
            problems.append(f"usage.{key}: must be at least 1")
    if config.usage.flush_interval_s <= 0:
        problems.append("usage.flush_interval_s: must be greater than 0")
    for p in config.providers().values():
        prices = ("price_input_per_mtok", "price_cached_input_per_mtok", "price_output_per_mtok")
        for price in prices:
            if getattr(p, price) < 0:
                problems.append(f"providers.{p.name}.{price}: must be at least 0")
    if config.redis is not None:
        try:
            parse_redis_url(config.redis.url)
        except ValueError as exc:
            problems.append(f"redis.url: {exc}")
        if config.redis.timeout_s <= 0:
            problems.append("redis.timeout_s: must be greater than 0")
        # Renewed every third of the TTL, each renewal within timeout_s.
        if config.redis.lease_ttl_s < 3 * config.redis.timeout_s:
            problems.append(
                "redis.lease_ttl_s: must be at least 3 x redis.timeout_s "
                f"({3 * config.redis.timeout_s:g}), or leases expire while renewed"
            )
    if config.limits.hold_ttl_s <= 0:
        problems.append("limits.hold_ttl_s: must be greater than 0")
    if config.usage.sink == "redis_stream" and config.redis is None:
        problems.append('usage.sink: "redis_stream" needs a [redis] table')
    if config.usage.stream_maxlen < 1:
        problems.append("usage.stream_maxlen: must be at least 1")
    if config.usage.ledger == "":
        problems.append('usage.ledger: a file path, or "none"')
    return problems


def _raw_secret_problems(raw: dict[str, Any], environ: Mapping[str, str]) -> list[str]:
    problems = []
    aliases = raw.get("aliases")
    for alias_name, alias in aliases.items() if isinstance(aliases, dict) else ():
        providers = alias.get("providers") if isinstance(alias, dict) else None
        for i, provider in enumerate(providers if isinstance(providers, list) else ()):
            env = provider.get("api_key_env") if isinstance(provider, dict) else None
            if isinstance(env, str) and not environ.get(env):
                problems.append(
                    f"aliases.{alias_name}.providers[{i}].api_key_env: "
                    f"environment variable {env!r} is not set"
                )
    return problems


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
        raise ConfigError(source, problems + _raw_secret_problems(raw, env))
    problems = _semantic_problems(config, env)
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
