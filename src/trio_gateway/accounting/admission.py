"""Admission and settlement: a keyed request's budget hold and rate limits, around the relay.

::

    front: authorize(request, key) ─▶ Limits.admit ─▶ 402 / 429 / (503 fail_closed) or Admission
    relay ends (completed, failed, cancelled) ─▶ usage record ─▶ Limits.settle (shielded, short)

One store call at admission and one at the end; nothing per chunk. Every store call runs under
``[redis] timeout_s`` at the call site; a store that fails or is late follows ``on_error``:
``fail_open`` serves the request unlimited (logged), ``fail_closed`` refuses it with 503
``limits_unavailable``.
"""

from __future__ import annotations

import logging
import math
import secrets
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping

import attrs
import trio
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from trio_gateway.accounting.limit_store import (
    AdmitArgs,
    AdmitResult,
    LimitStore,
    MemoryStore,
    RedisStore,
)
from trio_gateway.accounting.limits import (
    NANOS_PER_UNIT,
    Prices,
    RateDecision,
    budget_headers,
    cost_nanos,
    exact_units,
    nanos,
    rate_headers,
    reserve_nanos,
    reserve_tokens,
    reset_text,
)
from trio_gateway.config.schema import GatewayConfig, ProviderConfig
from trio_gateway.core.budget_period import NO_PERIOD, Period, period_of
from trio_gateway.core.endpoints import COMPLETIONS_DEFAULT_MAX_TOKENS, completion_choices
from trio_gateway.core.errors import BudgetExceeded, LimitsUnavailable, RateLimited
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.usage import UsageRecord, estimate_body_prompt
from trio_gateway.redis.client import RedisClient, RedisError

log = logging.getLogger("trio_gateway")

# Without Redis the in-process store answers at once; this only bounds a bug.
LOCAL_TIMEOUT_S = 1.0
# A Redis that is down fails every request's admit: one log line per interval, not per request
# (the counter gateway_limits_store_errors_total has them all).
STORE_ERROR_LOG_INTERVAL_S = 10.0
# Reading a key's spend from the ledger (a key the in-process store has not seen: a budget or
# a period given while serving) is one indexed query; this bounds a ledger on a stuck disk.
SEED_TIMEOUT_S = 10.0

# A key's spend in the usage ledger since a time: how the in-process store learns what a key
# spent before this process (accounting/spend.py).
Seeder = Callable[[str, float], Awaitable[int]]


def prices_of(provider: ProviderConfig) -> Prices:
    return Prices(
        input=provider.price_input_per_mtok,
        cached_input=provider.price_cached_input_per_mtok,
        output=provider.price_output_per_mtok,
    )


@attrs.frozen
class Reserve:
    """One provider a request may run on, and the most output tokens the request, translated
    for that provider's vendor, lets it produce (``Dialect.max_output_tokens``)."""

    provider: ProviderConfig
    max_output_tokens: int


@attrs.frozen(kw_only=True)
class Admission:
    """A request let in: its hold (to settle) and the headers every answer carries."""

    key: str
    hold_id: str | None  # None: no budget, or admitted unlimited by fail_open
    headers: list[tuple[bytes, bytes]]
    # The prices of each provider the request may run on, as they were when it was admitted
    # (its hold was computed from them): it is settled at the answering provider's, even if
    # a reload changed them or removed the provider while it ran.
    prices: Mapping[str, Prices] = attrs.field(factory=dict)
    # The key's budget period when it was admitted: its cost counts in the period of that kind
    # its record started in.
    budget_period: str = NO_PERIOD


def record_cost(prices: Mapping[str, Prices], record: UsageRecord) -> int:
    """What ``record`` costs at the prices of the provider that answered it (0: none did, or
    it is not among ``prices``). The usage record says it, and the budget is billed it."""
    found = prices.get(record.provider or "")
    if found is None:
        return 0
    return cost_nanos(found, record.prompt_tokens, record.cached_tokens, record.completion_tokens)


class Limits:
    """Budgets and rate limits of keyed requests, on the configured store."""

    def __init__(
        self,
        store: LimitStore,
        *,
        timeout_s: float,
        fail_open: bool,
        hold_ttl_s: float,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.fail_open = fail_open
        self.hold_ttl_s = hold_ttl_s
        # Budget periods are UTC calendar days, weeks, months: the wall clock's.
        self.wall_clock = wall_clock
        # Without Redis: where a key's earlier spend is read from (the usage ledger), for a key
        # the in-process store does not know yet. None: no ledger, nothing to read.
        self.seeder: Seeder | None = None
        self.store_errors: Counter[str] = Counter()  # by call: "admit", "settle"
        self._logged_at = -math.inf
        self._unlogged = 0

    def _store_failed(self, call: str, what: str) -> None:
        self.store_errors[call] += 1
        now = trio.current_time()
        if now - self._logged_at < STORE_ERROR_LOG_INTERVAL_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more since the last line)" if self._unlogged else ""
        self._logged_at, self._unlogged = now, 0
        log.warning("limits: %s%s", what, more)

    def collector(self) -> Collector:
        return _StoreErrorCollector(self)

    async def admit(
        self,
        key: ApiKey | None,
        body: dict[str, object],
        reserves: tuple[Reserve, ...],
        kind: RequestKind = RequestKind.CHAT,
    ) -> Admission | None:
        """None for a request with nothing to enforce; else its admission, or 402/429/503.

        ``reserves``: the providers the request may run on (the Router's plan, in order), each
        with the most output the request sent there may produce."""
        if key is None or (key.rpm is None and key.tpm is None and key.budget is None):
            return None
        prompt = estimate_body_prompt(body, kind, (r.provider.type for r in reserves))
        # tpm counts the client's limit (else the alias's default_max_tokens), as OpenAI counts
        # its own: a rate, charged once at admission, not the worst case a hold must cover.
        default_max = max((r.provider.default_max_tokens for r in reserves), default=4096)
        if kind is RequestKind.COMPLETIONS:
            # What the vendors generate when a completion names no max_tokens.
            default_max = COMPLETIONS_DEFAULT_MAX_TOKENS
        elif kind is RequestKind.EMBEDDINGS:
            default_max = 0  # an embedding generates nothing: its prompt is all it costs
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        tokens = reserve_tokens(
            prompt, max_tokens if isinstance(max_tokens, int) else None, default_max
        )
        if kind is RequestKind.COMPLETIONS:
            # Each prompt, n times, is a choice that may generate max_tokens of its own.
            tokens = prompt + (tokens - prompt) * completion_choices(body)
        # The provider is not chosen yet: the hold covers the costliest of them, each at its
        # prices for all the output the request sent there may produce, so that no answer can
        # cost more than was held.
        hold = max(
            (reserve_nanos(prices_of(r.provider), prompt, r.max_output_tokens) for r in reserves),
            default=0,
        )
        hold_id = secrets.token_hex(8) if key.budget is not None else None
        now = self.wall_clock()
        period = period_of(key.budget_period, now)
        if key.budget is not None:
            await self.seed(key.name, period)
        args = AdmitArgs(
            key=key.name,
            rpm=key.rpm,
            tpm=key.tpm,
            tokens=tokens,
            budget=None if key.budget is None else nanos(key.budget),
            hold=hold,
            hold_id=hold_id or "",
            ttl_s=self.hold_ttl_s,
            period=period,
        )
        result = await self._admit(args)
        if result is None:
            return Admission(key=key.name, hold_id=None, headers=[])
        prices = {r.provider.name: prices_of(r.provider) for r in reserves}
        headers = rate_headers(result.requests, result.tokens)
        budget = (
            []
            if args.budget is None
            else budget_headers(args.budget, result.available, period.renews_in_s(now))
        )
        if result.refused == "rate":
            raise RateLimited(
                f"API key {key.name!r} is over its rate limit "
                f"(rpm: {key.rpm or '-'}, tpm: {key.tpm or '-'}); this request counts "
                f"{tokens} tokens (prompt estimate + max_tokens)",
                retry_after_s=max(result.retry_after_s, 0.001),
                rate_headers=headers,
            )
        if result.refused == "budget":
            # Nothing was taken: the headers say what is left before this request, not after.
            headers = rate_headers(_untaken(result.requests, 1), _untaken(result.tokens, tokens))
            raise BudgetExceeded(
                f"API key {key.name!r} has {result.available / NANOS_PER_UNIT:.6f} of its budget "
                f"left (after running requests' holds); this request may cost up to "
                f"{hold / NANOS_PER_UNIT:.6f} (prompt estimate + the most output the alias's "
                "costliest provider may produce for it): lower max_tokens, or raise the budget"
                f"; {renewal(key, period, now)}",
                rate_headers=headers + budget,
            )
        return Admission(
            key=key.name,
            hold_id=hold_id,
            headers=headers + budget,
            prices=prices,
            budget_period=key.budget_period,
        )

    async def spent(self, key: ApiKey) -> int:
        """What ``key`` has spent in its budget's current period, as the store keeps it
        (Redis, or this process); 503 ``limits_unavailable`` when the store does not answer
        within ``timeout_s``."""
        period = period_of(key.budget_period, self.wall_clock())
        try:
            with trio.fail_after(self.timeout_s):
                return await self.store.spent_in(key.name, period)
        except (RedisError, trio.TooSlowError) as exc:
            raise LimitsUnavailable(
                str(exc) or f"no answer within {self.timeout_s:g} s", retry_after_s=1.0
            ) from exc

    async def seed(self, key: str, period: Period) -> None:
        """Learn ``key``'s spend in ``period`` from the ledger, once, if the in-process store
        has not seen a period of that kind for it (a key that gained a budget, or changed its
        period, while serving; at start every key is seeded: :func:`seed_keys`)."""
        store = self.store
        if self.seeder is None or not isinstance(store, MemoryStore) or store.knows(key, period):
            return
        try:
            with trio.fail_after(SEED_TIMEOUT_S):
                spent = await self.seeder(key, period.start)
        except (OSError, sqlite3.Error, trio.TooSlowError) as exc:
            log.error(
                "limits: the spend of key %s could not be read from the usage ledger (%s); "
                "its budget counts from 0 in this process",
                key,
                str(exc) or f"no answer within {SEED_TIMEOUT_S:g} s",
            )
            spent = 0
        store.seed(key, period, spent)

    async def _admit(self, args: AdmitArgs) -> AdmitResult | None:
        """The store's answer; None when it failed and the policy is fail_open."""
        try:
            with trio.fail_after(self.timeout_s):
                return await self.store.admit(args)
        except (RedisError, trio.TooSlowError) as exc:
            problem = str(exc) or f"no answer within {self.timeout_s}s"
            if not self.fail_open:
                self._store_failed(
                    "admit", f"store unavailable ({problem}); refusing (fail_closed)"
                )
                raise LimitsUnavailable(
                    "budgets and rate limits cannot be checked right now; retry shortly",
                    retry_after_s=1.0,
                ) from exc
            self._store_failed(
                "admit", f"store unavailable ({problem}); serving unlimited (fail_open)"
            )
            return None

    async def settle(self, admission: Admission | None, record: UsageRecord) -> None:
        """Bill the tokens ``record`` counts at the prices its provider had when the request was
        admitted, and drop the hold (no provider answered: nothing billed). Runs in cleanup,
        even when the request was cancelled: shielded, with a short deadline."""
        if admission is None or admission.hold_id is None:
            return
        cost = record_cost(admission.prices, record)
        period = period_of(admission.budget_period, record.started_at)
        with trio.CancelScope(shield=True), trio.move_on_after(self.timeout_s) as late:
            try:
                await self.store.settle(admission.key, admission.hold_id, cost, period)
            except RedisError as exc:
                # The hold expires at its TTL; the cost is lost to the budget (logged).
                self._store_failed(
                    "settle", f"could not settle {cost} nanos for key {admission.key} ({exc})"
                )
        if late.cancelled_caught:
            self._store_failed(
                "settle",
                f"settling {cost} nanos for key {admission.key} timed out; its hold expires",
            )


def renewal(key: ApiKey, period: Period, now: float) -> str:
    """When ``key``'s budget is whole again, as a 402 says it."""
    budget = exact_units(nanos(key.budget or 0.0))
    renews_in = period.renews_in_s(now)
    if renews_in is None:
        return f"its budget ({budget} for the key's whole life: budget_period none) does not renew"
    return (
        f"its budget ({budget} a {period.kind}, UTC) renews at {period.renews_at()}, "
        f"in {reset_text(renews_in)}"
    )


def _untaken(decision: RateDecision | None, cost: int) -> RateDecision | None:
    """A decision as if its ``cost`` had not been taken (both stores answer after taking)."""
    if decision is None:
        return None
    cost = min(cost, decision.limit)
    return attrs.evolve(
        decision,
        remaining=min(decision.limit, decision.remaining + cost),
        reset_s=max(0.0, decision.reset_s - cost * 60.0 / decision.limit),
    )


class _StoreErrorCollector(Collector):
    def __init__(self, limits: Limits) -> None:
        self._limits = limits

    def collect(self) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "gateway_limits_store_errors",
            "Budget and rate-limit store calls that failed or missed [redis] timeout_s",
            labels=["call"],
        )
        for call in ("admit", "settle"):
            errors.add_metric([call], self._limits.store_errors[call])
        yield errors


def local_limits(hold_ttl_s: float = 900.0) -> Limits:
    return Limits(MemoryStore(), timeout_s=LOCAL_TIMEOUT_S, fail_open=False, hold_ttl_s=hold_ttl_s)


def open_limits(config: GatewayConfig, client: RedisClient | None) -> Limits:
    """The limits ``config`` asks for: on Redis when ``[redis]`` is set, else in process."""
    if config.redis is None or client is None:
        return local_limits(config.limits.hold_ttl_s)
    return Limits(
        RedisStore(client, config.redis.key_prefix),
        timeout_s=config.redis.timeout_s,
        fail_open=config.redis.on_error == "fail_open",
        hold_ttl_s=config.limits.hold_ttl_s,
    )
