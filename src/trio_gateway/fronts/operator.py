"""The operator's endpoints: the status page and its data, /metrics, /healthz, /readyz.

When the gateway requires keys (``[auth] keys_file``) and ``[server] status`` is ``"admin"``
(the default), the data is behind a key marked ``admin = true`` in the keys file::

    GET /status.json, /metrics   no key: 401; a key not admin: 403 admin_required
    GET /, /status               the page: no data in it; it asks for the key, keeps it in the
                                 tab's sessionStorage and reads /status.json with it
    GET /healthz, /readyz        open (probes carry no key): ready or not, and why in one word;
                                 the detail (providers, their errors) with an admin key

``status = "open"``, or a gateway without keys, serves them all to anyone, as before.
"""

from __future__ import annotations

import logging
import os

import trio

from trio_gateway.accounting.key_store import KeyStore
from trio_gateway.accounting.limit_store import RedisStore
from trio_gateway.accounting.limits import nanos
from trio_gateway.capacity.health import HealthSnapshot
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.core.budget_period import period_of
from trio_gateway.core.errors import AdminRequired, LimitsUnavailable, Unauthorized
from trio_gateway.core.keys import ApiKey
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.auth import http_key
from trio_gateway.fronts.http import Scope, Send, send_bytes, send_json
from trio_gateway.ops.metrics import CONTENT_TYPE
from trio_gateway.ops.status import PAGE, BudgetLine, keys_panel, status_document
from trio_gateway.providers.openai_compatible.replicas import ReplicaSet

log = logging.getLogger("trio_gateway")

OPERATOR_PATHS = frozenset({"/", "/status", "/status.json", "/metrics", "/healthz", "/readyz"})
# The status page's keys panel: the keys with a budget shown (most spent first), and how many
# of today's dearest keys.
MAX_BUDGET_LINES = 100
TOP_KEYS_TODAY = 10


def admin_access(scope: Scope, config: GatewayConfig, keys: KeyStore | None) -> None:
    """Let the request at the operator's data, or raise 401 (no key, an unknown key) or 403
    ``admin_required`` (a key not marked admin)."""
    if keys is None or config.server.status == "open":
        return
    key = http_key(scope, keys)
    if key is not None and not key.admin:
        raise AdminRequired(
            f"API key {key.name!r} may not read the gateway's status and metrics: give the "
            "operator a key marked admin = true in the keys file (or [server] status = "
            '"open" to serve them to anyone)'
        )


def _detailed(scope: Scope, config: GatewayConfig, keys: KeyStore | None) -> bool:
    """Whether /healthz and /readyz may say more than ready or not: open, or an admin key."""
    try:
        admin_access(scope, config, keys)
    except (AdminRequired, Unauthorized):
        return False
    return True


async def serve_operator(
    path: str,
    scope: Scope,
    send: Send,
    *,
    config: GatewayConfig,
    router: Router,
    keys: KeyStore | None,
) -> None:
    """One of :data:`OPERATOR_PATHS`."""
    if path == "/healthz":
        # The pid tells apart the workers behind one port ([server] workers).
        body: dict[str, object] = {"status": "ok"}
        if _detailed(scope, config, keys):
            body["pid"] = os.getpid()
        await send_json(send, 200, body)
    elif path == "/readyz":
        await _readyz(send, router, detailed=_detailed(scope, config, keys))
    elif path in ("/", "/status"):
        await send_bytes(send, 200, PAGE, b"text/html; charset=utf-8")
    elif path == "/metrics":
        admin_access(scope, config, keys)
        await _metrics(send, router)
    else:
        admin_access(scope, config, keys)
        await send_json(send, 200, await _status(config, router, keys))


async def _readyz(send: Send, router: Router, *, detailed: bool) -> None:
    """Ready when every alias has a provider that is healthy or still starting."""
    ready = router.ready()
    not_ready = sorted(alias for alias, providers in ready.items() if not providers)
    draining = router.drain.stopping
    status = "draining" if draining else "not_ready" if not_ready else "ready"
    code = 503 if not_ready or draining else 200
    if not detailed:
        # For probes and anyone: no alias, provider or error names.
        reason = "draining" if draining else "no_provider" if not_ready else None
        await send_json(send, code, {"status": status} | ({"reason": reason} if reason else {}))
        return
    now = trio.current_time()
    body = {
        "status": status,
        "aliases_without_provider": not_ready,
        "providers": {
            name: _health_json(health.snapshot(now))
            | _replicas_json(router.upstreams.get(name), now)
            for name, health in router.health.items()
        },
    }
    await send_json(send, code, body)


async def _status(
    config: GatewayConfig, router: Router, keys: KeyStore | None
) -> dict[str, object]:
    document = status_document(
        aliases={alias: [p.name for p in a.providers] for alias, a in config.aliases.items()},
        gauges=router.gauges(),
        recent=router.recent,
        now=trio.current_time(),
        ready=all(router.ready().values()),
        draining=router.drain.stopping,
    )
    if keys is not None:
        document["keys"] = await _keys(router, list(keys.ring()))
    return document


async def _keys(router: Router, ring: list[ApiKey]) -> dict[str, object]:
    """Spend against budget for each key with one, where spend lives (Redis, or this
    process); and the keys that cost most today (this process's requests and its ledger's)."""
    limits = router.limits
    now = limits.wall_clock()
    lines = []
    problem = None
    for key in [k for k in ring if k.budget is not None][:MAX_BUDGET_LINES]:
        spent: int | None = None
        if problem is None:  # one deadline for the page, not one per key, when Redis is down
            try:
                spent = await limits.spent(key)
            except LimitsUnavailable as exc:
                problem = exc.message
        period = period_of(key.budget_period, now)
        lines.append(
            BudgetLine(
                name=key.name,
                budget=nanos(key.budget or 0.0),
                period=key.budget_period,
                spent=spent,
                renews_at=period.renews_at(),
            )
        )
    where = "redis" if isinstance(limits.store, RedisStore) else "this process"
    return keys_panel(lines, router.today.top(now, TOP_KEYS_TODAY), where=where, problem=problem)


async def _metrics(send: Send, router: Router) -> None:
    payload = router.metrics.render()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", CONTENT_TYPE.encode()),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def _health_json(snap: HealthSnapshot) -> dict[str, object]:
    return {
        "state": snap.state.value,
        "cooling_down": snap.cooling_down,
        "last_error": snap.last_error,
        "upstream_load": snap.upstream_load,
    }


def _replicas_json(provider: object, now: float) -> dict[str, object]:
    """A replicated provider's replicas, each as a provider is shown."""
    if not isinstance(provider, ReplicaSet):
        return {}
    return {"replicas": {r.name: _health_json(r.health.snapshot(now)) for r in provider.replicas}}
