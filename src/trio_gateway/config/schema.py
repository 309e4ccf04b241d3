"""``gateway.toml``: frozen attrs classes read through one strict cattrs converter.

Strict means: unknown keys, wrong types (``"8"`` is not 8, ``true`` is not 1) and missing fields are
errors, and every problem in a file is reported at once, each with its dotted path.
"""

from __future__ import annotations

from typing import Literal

import attrs

from trio_gateway.core.capability import Capability
from trio_gateway.sim.config import SimConfig

DEFAULT_CONFIG_NAME = "gateway.toml"


ProviderType = Literal["openai_compatible", "openai", "anthropic", "gemini", "vertex"]
ProbeEndpoint = Literal["chat", "completions", "embeddings"]
PROVIDER_TYPES: tuple[str, ...] = ("openai_compatible", "openai", "anthropic", "gemini", "vertex")
# Each vendor's public endpoint, as its own SDK spells it (paths are appended by the dialect).
DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
    "vertex": "https://{location}-aiplatform.googleapis.com",
}
# A provider's keys that name a file. Every file path of a config (these, ``auth.keys_file``
# and ``usage.ledger``), when relative, is read from the config file's directory
# (load.resolve_paths), the same whichever directory a command runs in.
PROVIDER_PATH_KEYS = ("api_key_file", "credentials_file", "ca_file")
OnSaturated = Literal["spill", "queue"]
# [server] workers: a number, or "auto" (one per core the process may use: process/cores.py).
Workers = int | Literal["auto"]
Routing = Literal["round_robin", "least_loaded", "affinity"]
ROUTINGS: tuple[str, ...] = ("round_robin", "least_loaded", "affinity")
OnRedisError = Literal["fail_open", "fail_closed"]
# Who may read the operator's endpoints (/status.json, /metrics, /readyz's detail) when the
# gateway requires keys: keys marked admin, or anyone.
StatusAccess = Literal["admin", "open"]
OnLeaseError = Literal["share", "refuse"]
UsageSinkKind = Literal["sqlite", "redis_stream", "none"]
# What `reasoning: false` does on a model that cannot stop reasoning (docs/configuration.md).
ReasoningOff = Literal["refuse", "lowest"]
BuiltinTools = Literal["drop", "refuse"]
# What a /v1/messages request that does not enable thinking asks of the provider.
MessagesWithoutThinking = Literal["model_default", "off"]
MESSAGES_WITHOUT_THINKING: tuple[str, ...] = ("model_default", "off")
FilterAction = Literal["mask", "block"]
FilterField = Literal["content", "reasoning", "tool_arguments"]
FILTER_FIELDS: tuple[FilterField, ...] = ("content", "reasoning", "tool_arguments")


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
    # No longer used: answers go to the client as they come. Still accepted, so an older config
    # stays valid; `check` and `serve` warn when a file sets it (checks.unused_key_warnings).
    stream_buffer_events: int = 64
    client_stall_timeout_s: float = 30.0
    # A request's head must be whole this long after the connection opened (or, on a kept-alive
    # connection, after its first byte came); its body this long after the gateway began to
    # read it (docs/architecture.md, "The HTTP/1.x edge").
    head_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    drain_timeout_s: float = 30.0
    # Processes serving one listening socket, each a whole gateway (docs/deployment.md), or
    # "auto": one per core the process may use (its CPU affinity and cgroup quota).
    workers: Workers = 1
    # With keys required: "admin" (an `admin = true` key reads the operator's endpoints) or
    # "open" (anyone, as without keys). docs/operations.md#the-operators-endpoints.
    status: StatusAccess = "admin"


@attrs.frozen(kw_only=True)
class ResponsesSocketConfig:
    """``[websocket.responses]``: the Responses API's WebSocket mode on ``/v1/responses``
    (docs/api.md, "WebSocket mode")."""

    # A socket older than this answers websocket_connection_limit_reached, then closes (the
    # API's 60 minutes).
    max_age_s: float = 3600.0
    # A socket with nothing answering and nothing received for this long is closed (1000).
    idle_timeout_s: float = 900.0
    # A larger client message closes the socket with 1009.
    max_message_bytes: int = 4 * 1024 * 1024
    # Lanes (stream_id) answering at once on one socket; a create opening one more is refused.
    max_lanes: int = 8
    # What response.create messages waiting behind their lane's answer may hold, in bytes
    # (each counted at least 1 KiB); one more is refused.
    max_queued_bytes: int = 8 * 1024 * 1024
    # The socket's own recent responses (previous_response_id with store: false), in bytes;
    # the oldest use goes first.
    memory_bytes: int = 16 * 1024 * 1024


@attrs.frozen(kw_only=True)
class WebSocketConfig:
    """``GET /v1/ws`` limits (docs/events.md); ``max_sockets`` counts the Responses API's
    sockets on ``/v1/responses`` too, whose own limits are ``responses``."""

    # Sockets open at once on this gateway; one more is refused at the handshake (HTTP 403).
    max_sockets: int = 1000
    max_message_bytes: int = 4 * 1024 * 1024
    max_requests_per_socket: int = 16
    # Events waiting to be written; a client that lets more pile up is closed (4001).
    max_queued_events: int = 1024
    ping_interval_s: float = 20.0
    ping_timeout_s: float = 20.0
    responses: ResponsesSocketConfig = ResponsesSocketConfig()


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
    # The most output tokens the model produces per request (thinking included), in place of
    # the gateway's table for the vendor (providers/output_caps.py): anthropic's max_tokens is
    # clamped to it, and a budget hold for a request without a limit counts it.
    max_output_tokens: int | None = None
    # The cloud vendors: the model family whose rules the dialect follows (docs/providers.md,
    # "Model families"), in place of the one `model` is matched to.
    model_family: str | None = None
    # `reasoning: false` to a model that cannot stop reasoning (o3, gpt-5-pro, gemini-2.5-pro):
    # a 400 naming the model, or the model's lowest effort.
    reasoning_off: ReasoningOff = "refuse"
    max_inflight: int = 32
    queue_timeout_s: float = 1.0
    # New connections to one endpoint at once, from the dial to the response head (split
    # among [server] workers); the rest wait their turn within queue_timeout_s. Half of
    # uvicorn's (so vLLM's) listen backlog of 2048: docs/configuration.md says why.
    max_dials_in_flight: int = 1024
    capabilities: frozenset[Capability] = frozenset()
    weight: int = 100
    strip_fields: tuple[str, ...] = ()
    connect_timeout_s: float = 5.0
    # The certificate authorities (PEM) this provider's TLS peers are signed by, in place of
    # SSL_CERT_FILE / SSL_CERT_DIR / certifi's: for the chat exchange and every side request
    # (a private CA, or a TLS-inspecting proxy's; http1/tls.py).
    ca_file: str | None = None
    first_token_timeout_s: float = 120.0
    idle_timeout_s: float = 60.0
    # Readiness: a real one-token generation, outside the gate.
    probe: bool = True
    # What the probe asks: a chat (the default), a completion, or an embedding (a vLLM serving
    # an embedding model has no chat to ask).
    probe_endpoint: ProbeEndpoint = "chat"
    probe_interval_s: float = 30.0
    probe_timeout_s: float = 15.0
    unhealthy_after: int = 3
    healthy_after: int = 2
    startup_grace_s: float = 600.0
    # Per million tokens, in the unit of the keys' budgets (docs/accounting.md#budgets).
    price_input_per_mtok: float = 0.0
    price_cached_input_per_mtok: float = 0.0
    price_output_per_mtok: float = 0.0
    # openai_compatible only: send each request's priority as vLLM's `priority` field, for a
    # server run with `--scheduling-policy priority` (vLLM 0.32 ignores it under "fcfs").
    priority_scheduling: bool = False
    # Slots of max_inflight held back for requests of priority <= reserved_for_priority_at_most:
    # the others may hold at most max_inflight - reserved_slots (capacity/priority.py).
    reserved_slots: int = 0
    reserved_for_priority_at_most: int | None = None

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
    # The Responses front's built-in tools (web_search, file_search...), which no provider
    # behind the gateway runs: dropped from the request (named in x-gateway-dropped-tools), or
    # the request refused (400).
    builtin_tools: BuiltinTools = "drop"
    # A /v1/messages request without thinking gets no thinking blocks, as from Anthropic;
    # "model_default" says nothing to the provider (a model that thinks by default, Qwen3,
    # still thinks, and is paid for), "off" turns its thinking off.
    messages_without_thinking: MessagesWithoutThinking = "model_default"
    # Names of [filters.NAME] tables: the answer's text through these (core/filters.py); a
    # request whose messages match one of input_filters is refused (400 content_filtered).
    output_filters: tuple[str, ...] = ()
    input_filters: tuple[str, ...] = ()
    # The priority class of its requests when their key has none (core/priority.py).
    priority: int = 0
    # A request waiting at a gate gains one priority class per this many seconds waited.
    priority_aging_s: float = 2.0


@attrs.frozen(kw_only=True)
class FilterConfig:
    """``[filters.NAME]``: literals and bounded regexes, masked or blocking (docs/configuration.md,
    "Filters")."""

    patterns: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    action: FilterAction = "mask"
    mask: str = "***"
    case_sensitive: bool = False
    applies_to: tuple[FilterField, ...] = FILTER_FIELDS


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
    # rediss:// only: the certificate authorities (PEM) the server's certificate is checked
    # against, in place of SSL_CERT_FILE / SSL_CERT_DIR / the system's.
    ca_file: str | None = None
    # A Redis Cluster: url names one of its nodes, each call goes to its keys' node.
    cluster: bool = False
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
class ResponsesConfig:
    """``[responses]``: the Responses front's stored responses and sealed reasoning
    (docs/api.md, "The Responses front")."""

    # How long a stored response may be continued (previous_response_id), referred to
    # (item_reference) or read, from its last use (written, or continued).
    store_ttl_s: float = 7 * 24 * 3600.0
    # A record (a turn's own input items and its response) past this is not stored; the
    # answer says so (x-gateway-response-stored).
    max_record_bytes: int = 4 * 1024 * 1024
    # What one API key's records may hold in the store, all together; past it, its records
    # of the oldest use go first.
    key_quota_bytes: int = 256 * 1024 * 1024
    # How much of a conversation previous_response_id reads back: turns, and their bytes.
    max_chain_turns: int = 1000
    max_chain_bytes: int = 32 * 1024 * 1024
    # Without [redis] or a ledger file, each process's memory keeps at most this many records,
    # and this many bytes of them.
    memory_max_responses: int = 10_000
    memory_max_bytes: int = 128 * 1024 * 1024
    # An environment variable holding the Fernet key that seals reasoning (encrypted_content);
    # unset: a key made per process (reasoning sealed by another process is not read).
    seal_key_env: str | None = None


@attrs.frozen(kw_only=True)
class TracingConfig:
    """``[tracing]``: the gateway's own spans, exported over OTLP/HTTP (protobuf) to a collector
    (docs/operations.md, "Traces"). Without the section, no span is made."""

    # The collector's traces URL, whole: http://otel-collector:4318/v1/traces.
    otlp_endpoint: str
    # Headers sent with every export, each by the environment variable that holds its value
    # (authorization = "OTLP_TOKEN"): a token is never in the file, and never logged.
    headers: dict[str, str] = attrs.field(factory=dict)
    # The share of new traces recorded. A client's traceparent decides for its own trace:
    # sampled, always recorded; not sampled, never.
    sample_ratio: float = 1.0
    service_name: str = "trio-gateway"
    # Prompts and answers on the spans (gen_ai.input.messages, gen_ai.output.messages).
    capture_content: bool = False
    # Ended spans waiting for the exporter; past this, new ones are dropped (and counted).
    max_queued_spans: int = 2048
    max_batch_spans: int = 512
    export_interval_s: float = 5.0
    # One export's deadline, its retries included.
    export_timeout_s: float = 10.0


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
    responses: ResponsesConfig = ResponsesConfig()
    filters: dict[str, FilterConfig] = attrs.field(factory=dict)
    tracing: TracingConfig | None = None
    # Not read from TOML (a file that holds them is refused): filled in by load, from the
    # environment; and what the file holds that is accepted but does nothing, said by `check`
    # and at start.
    api_keys: dict[str, Secret] = attrs.field(factory=dict)
    seal_key: Secret | None = None  # [responses] seal_key_env's value
    tracing_headers: dict[str, Secret] = attrs.field(factory=dict)  # [tracing] headers' values
    source: str = "<config>"
    warnings: tuple[str, ...] = ()
    # Where server.listen came from, for messages about it: the file, or `serve --listen`.
    listen_origin: str = "server.listen"

    def providers(self) -> dict[str, ProviderConfig]:
        """Every provider by name; aliases that name the same provider share it."""
        return {p.name: p for alias in self.aliases.values() for p in alias.providers}


class ConfigError(Exception):
    """Every problem found in one config file."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))
