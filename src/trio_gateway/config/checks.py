"""The value checks of ``gateway.toml``: what the types alone cannot say.

``config.py`` reads a file into its classes (the structure); these functions then list every
problem with a value, each with its dotted path, so that all of them are reported at once.
"""

from __future__ import annotations

import ipaddress
import json
import re
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.fernet import Fernet

from trio_gateway.config.tracing_checks import tracing_problems
from trio_gateway.core.budget_period import NO_PERIOD
from trio_gateway.core.filter_match import RegexRefused, pattern_problem, regex_reach
from trio_gateway.core.keys import KeysFileError, load_keys
from trio_gateway.core.model_families import TABLES
from trio_gateway.core.priority import PRIORITY_MAX, PRIORITY_MIN, PRIORITY_RANGE
from trio_gateway.redis.url import parse_redis_url

if TYPE_CHECKING:
    from trio_gateway.config.schema import GatewayConfig, ProviderConfig, ResponsesSocketConfig

# Worker processes of one `serve`: a bound on what one mistyped number starts.
MAX_WORKERS = 64


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


def _reservation_problems(where: str, p: ProviderConfig) -> list[str]:
    """reserved_slots must leave the capped class a slot, and says for whom it is kept."""
    if p.reserved_slots == 0 and p.reserved_for_priority_at_most is None:
        return []
    if p.reserved_for_priority_at_most is None:
        return [f"{where}.reserved_slots: needs reserved_for_priority_at_most (for whom)"]
    problems = []
    if not PRIORITY_MIN <= p.reserved_for_priority_at_most <= PRIORITY_MAX:
        problems.append(f"{where}.reserved_for_priority_at_most: {PRIORITY_RANGE}")
    if p.reserved_slots < 1:
        problems.append(
            f"{where}.reserved_slots: must be at least 1 with reserved_for_priority_at_most"
        )
    elif p.reserved_slots >= p.max_inflight:
        problems.append(
            f"{where}.reserved_slots: must be less than max_inflight ({p.max_inflight}): the "
            "other classes need at least one slot"
        )
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
    if p.priority_scheduling and p.type != "openai_compatible":
        # Only vLLM's API has a per-request priority; the cloud vendors have no such field.
        problems.append(
            f"{where}.priority_scheduling: only for type 'openai_compatible' (vLLM's "
            f"`priority` field); type {p.type!r} has no per-request priority"
        )
    for key in ("project", "location"):
        value = getattr(p, key)
        if p.type == "vertex" and not value:
            problems.append(f"{where}.{key}: required for type 'vertex'")
        elif p.type != "vertex" and value is not None:
            problems.append(f"{where}.{key}: only for type 'vertex'")
    if p.location is not None and not re.fullmatch(r"[a-z0-9-]+", p.location):
        problems.append(f"{where}.location: expected a region name like 'us-central1'")
    if p.probe_endpoint != "chat" and p.type not in ("openai_compatible", "openai"):
        problems.append(
            f"{where}.probe_endpoint: {p.probe_endpoint!r} only for types 'openai_compatible' "
            "and 'openai'"
        )
    if p.default_max_tokens < 1:
        problems.append(f"{where}.default_max_tokens: must be at least 1")
    if p.max_output_tokens is not None and p.max_output_tokens < 1:
        problems.append(f"{where}.max_output_tokens: must be at least 1")
    if p.model_family is not None:
        families = TABLES.get(p.type, {})
        if not families:
            problems.append(f"{where}.model_family: only for the cloud vendors' types")
        elif p.model_family not in families:
            problems.append(
                f"{where}.model_family: unknown {p.type} family {p.model_family!r} "
                f"(known: {', '.join(sorted(families))})"
            )
    for key in ("api_key_file", "credentials_file"):
        path = getattr(p, key)
        if path is not None and (err := _credential_file_problem(path, key)) is not None:
            problems.append(f"{where}.{key}: {err}")
    if p.ca_file is not None and (err := ca_file_problem(p.ca_file)) is not None:
        problems.append(f"{where}.ca_file: {err}")
    return problems


def key_prefix_problem(prefix: str) -> str | None:
    """A ``{`` in the prefix opens the keys' hash tag (Redis Cluster hashes what is between
    the first ``{`` and the next ``}``): unclosed, it would take in each key's own part and
    scatter one script's keys over several slots."""
    start = prefix.find("{")
    if start != -1 and prefix.find("}", start) <= start + 1:
        return (
            f"{prefix!r} opens a hash tag ('{{') it does not close around something ('}}'); "
            "remove the braces, or put a whole tag in it, e.g. '{tgw}:' (every key in one slot)"
        )
    return None


def ca_file_problem(path: str) -> str | None:
    """Whether a file holds certificate authorities a TLS context can load (PEM)."""
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError as exc:  # an OSError too: first
        return f"{path} holds no PEM certificate ({exc.reason or exc})"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    return None


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
            f"auth: {config.listen_origin} {config.server.listen!r} is not a loopback address, "
            'so callers need API keys: give [auth] keys_file = "PATH" (or open = true to serve '
            "without)"
        ]
    if auth.keys_file is not None:
        try:
            load_keys(auth.keys_file, known_aliases=config.aliases.keys())
        except KeysFileError as exc:
            return [f"auth.keys_file: {exc.source}: {problem}" for problem in exc.problems]
    return []


def semantic_problems(config: GatewayConfig, environ: Mapping[str, str] | None) -> list[str]:
    """Every problem of a structurally valid config; ``environ`` None: its secrets are not
    read (a command that only reads records, ``trio-gateway usage``), so not checked."""
    problems: list[str] = []
    if (err := _parse_listen(config.server.listen)) is not None:
        problems.append(f"{config.listen_origin}: {err}")
    else:
        problems.extend(_auth_problems(config))
    workers = config.server.workers
    if workers != "auto" and not 1 <= workers <= MAX_WORKERS:
        problems.append(f'server.workers: must be from 1 to {MAX_WORKERS}, or "auto"')
    problems.extend(_responses_problems(config, environ))
    problems.extend(tracing_problems(config.tracing, environ))
    for key in ("max_body_bytes", "stream_buffer_events"):
        if getattr(config.server, key) < 1:
            problems.append(f"server.{key}: must be at least 1")
    for key in ("client_stall_timeout_s", "head_timeout_s", "body_timeout_s", "drain_timeout_s"):
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
    problems.extend(_responses_socket_problems(config.websocket.responses))
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
        if not PRIORITY_MIN <= alias.priority <= PRIORITY_MAX:
            problems.append(f"aliases.{alias_name}.priority: {PRIORITY_RANGE}")
        if not alias.priority_aging_s > 0:
            problems.append(f"aliases.{alias_name}.priority_aging_s: must be greater than 0")
        names_here: set[str] = set()
        for i, p in enumerate(alias.providers):
            where = f"aliases.{alias_name}.providers[{i}]"
            if p.name in names_here:
                problems.append(f"{where}.name: duplicate provider name {p.name!r} in this alias")
            names_here.add(p.name)
            if p.name in seen and seen[p.name][1] == p:
                continue  # the same provider again (a reference, or a copy): checked once
            if p.name in seen:
                problems.append(
                    f"{where}.name: provider {p.name!r} is also defined, differently, at "
                    f"{seen[p.name][0]} (define it once, and name it in the other aliases: "
                    f'providers = ["{p.name}"])'
                )
            seen.setdefault(p.name, (where, p))
            problems.extend(_provider_type_problems(where, p))
            if p.max_inflight < 1:
                problems.append(f"{where}.max_inflight: must be at least 1")
            if p.max_dials_in_flight < 1:
                problems.append(f"{where}.max_dials_in_flight: must be at least 1")
            problems.extend(_reservation_problems(where, p))
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
            if environ is not None and p.api_key_env and not environ.get(p.api_key_env):
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
        else:
            if config.redis.cluster and parse_redis_url(config.redis.url).db != 0:
                problems.append("redis.url: a Redis Cluster has only database 0")
            if config.redis.ca_file is not None:
                if not parse_redis_url(config.redis.url).tls:
                    problems.append("redis.ca_file: only for a rediss:// url (TLS)")
                elif (err := ca_file_problem(config.redis.ca_file)) is not None:
                    problems.append(f"redis.ca_file: {err}")
        if (err := key_prefix_problem(config.redis.key_prefix)) is not None:
            problems.append(f"redis.key_prefix: {err}")
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
    problems.extend(filter_problems(config))
    return problems


def filter_problems(config: GatewayConfig) -> list[str]:
    """``[filters.NAME]`` tables that cannot run, and aliases naming filters nobody defined."""
    problems: list[str] = []
    for name, spec in config.filters.items():
        where = f"filters.{name}"
        if not spec.patterns and not spec.regex:
            problems.append(f"{where}: give patterns or regex (or both)")
        for i, pattern in enumerate(spec.patterns):
            if (err := pattern_problem(pattern)) is not None:
                problems.append(f"{where}.patterns[{i}]: {err}")
        for i, source in enumerate(spec.regex):
            try:
                regex_reach(source, case_sensitive=spec.case_sensitive)
            except RegexRefused as exc:
                problems.append(f"{where}.regex[{i}]: {source!r}: {exc}")
        if not spec.applies_to:
            problems.append(f"{where}.applies_to: name at least one field")
        elif len(set(spec.applies_to)) != len(spec.applies_to):
            problems.append(f"{where}.applies_to: a field is listed twice")
    defined = ", ".join(sorted(config.filters)) or "none"
    for alias_name, alias in config.aliases.items():
        for key in ("output_filters", "input_filters"):
            names: tuple[str, ...] = getattr(alias, key)
            for i, name in enumerate(names):
                where = f"aliases.{alias_name}.{key}[{i}]"
                if name not in config.filters:
                    problems.append(
                        f"{where}: unknown filter {name!r} (defined with [filters.NAME]: {defined})"
                    )
                elif name in names[:i]:
                    problems.append(f"{where}: filter {name!r} is listed twice")
    return problems


# Keys still accepted, so that an older config stays valid, that no longer do anything; each
# with what to say to whoever set it.
UNUSED_KEYS = {
    ("server", "stream_buffer_events"): (
        "has no effect: answers go to the client as they come, with no buffer of the "
        "gateway's own; remove it (docs/configuration.md)"
    ),
}


_PRICES = ("price_input_per_mtok", "price_cached_input_per_mtok", "price_output_per_mtok")


def budget_warnings(config: GatewayConfig) -> list[str]:
    """Keys whose budget nothing can spend: every provider their aliases reach is free (the
    prices default to 0), so the budget never runs out. ``check`` and the start-up say so."""
    keys_file = config.auth.keys_file
    if keys_file is None:
        return []
    try:
        ring = load_keys(keys_file, known_aliases=config.aliases.keys())
    except KeysFileError:
        return []  # a problem of its own, reported as such
    warnings = []
    for key in ring:
        if key.budget is None:
            continue
        aliases = key.aliases or tuple(config.aliases)
        reached = {a: config.aliases[a].providers for a in aliases if a in config.aliases}
        if any(getattr(p, price) for ps in reached.values() for p in ps for price in _PRICES):
            continue
        per = "" if key.budget_period == NO_PERIOD else f" a {key.budget_period}"
        free = "; ".join(f"{a}: {', '.join(p.name for p in ps)}" for a, ps in reached.items())
        warnings.append(
            f"auth.keys_file: {keys_file}: keys.{key.name}.budget: {key.budget:g}{per}, but every "
            f"provider its aliases reach is free ({free}; every price_*_per_mtok is 0): nothing "
            "is ever billed to it; give the providers their prices (docs/accounting.md#budgets)"
        )
    return warnings


def unused_key_warnings(raw: Mapping[str, Any]) -> list[str]:
    """What the file sets that does nothing: accepted must never look like applied."""
    warnings = []
    for (section, key), why in UNUSED_KEYS.items():
        table = raw.get(section)
        if isinstance(table, dict) and key in table:
            warnings.append(f"{section}.{key}: {why}")
    return warnings


def raw_secret_problems(raw: dict[str, Any], environ: Mapping[str, str]) -> list[str]:
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


def _responses_socket_problems(settings: ResponsesSocketConfig) -> list[str]:
    """``[websocket.responses]``: positive times and bounds, and a queue that holds one
    message."""
    where = "websocket.responses"
    problems = [
        f"{where}.{name}: must be greater than 0"
        for name in ("max_age_s", "idle_timeout_s")
        if getattr(settings, name) <= 0
    ]
    problems += [
        f"{where}.{name}: must be at least 1"
        for name in ("max_message_bytes", "max_lanes", "max_queued_bytes", "memory_bytes")
        if getattr(settings, name) < 1
    ]
    if 1 <= settings.max_queued_bytes < settings.max_message_bytes:
        problems.append(
            f"{where}.max_queued_bytes: must be at least max_message_bytes "
            f"({settings.max_message_bytes}), or a large message could never wait its turn"
        )
    return problems


def _responses_problems(config: GatewayConfig, environ: Mapping[str, str] | None) -> list[str]:
    """``[responses]``: a positive TTL and bounds, bounds that hold a record, and a seal key
    that is one."""
    settings = config.responses
    problems = []
    if settings.store_ttl_s <= 0:
        problems.append("responses.store_ttl_s: must be greater than 0")
    for name in (
        "max_record_bytes",
        "key_quota_bytes",
        "max_chain_turns",
        "max_chain_bytes",
        "memory_max_responses",
        "memory_max_bytes",
    ):
        if getattr(settings, name) < 1:
            problems.append(f"responses.{name}: must be at least 1")
    for name in ("key_quota_bytes", "max_chain_bytes", "memory_max_bytes"):
        if 1 <= getattr(settings, name) < settings.max_record_bytes:
            problems.append(
                f"responses.{name}: must be at least max_record_bytes "
                f"({settings.max_record_bytes}), or no record the gateway stores fits"
            )
    env = settings.seal_key_env
    if env is not None and environ is not None:
        value = environ.get(env)
        if not value:
            problems.append(f"responses.seal_key_env: environment variable {env!r} is not set")
        else:
            try:
                Fernet(value.encode("ascii"))
            except (ValueError, UnicodeEncodeError):
                problems.append(
                    f"responses.seal_key_env: {env!r} does not hold a Fernet key (32 bytes, "
                    "URL-safe base64: python -c 'from cryptography.fernet import Fernet; "
                    "print(Fernet.generate_key().decode())')"
                )
    return problems
