"""Where budgets and rate limits keep their state: in this process, or in Redis (shared).

Both stores answer the same two calls with the same meaning:

- ``admit``: atomically, check the key's requests/min and tokens/min (GCRA, limits.py) and
  whether its budget covers ``budget - spent - live holds >= hold``; if everything passes, take
  the rate units and place the hold (which expires after ``ttl_s``: a replica that dies
  mid-request leaves no hold behind). Nothing is taken when anything refuses.
- ``settle``: add the real cost to the spend of the period the request started in, and
  delete the hold.

A key's spend is kept per budget period (core/budget_period.py): the admission checks the
period now, a settle adds to the period its request started in, so a budget renews when its
period ends, and a request admitted just before midnight counts on the day its record says.

Redis keys, under a prefix (default ``tgw:``): ``rl:req:{KEY}`` and ``rl:tok:{KEY}`` (the GCRA
``tat`` in ms, with a TTL of a minute past it), ``spent:{KEY}`` (nanos, no TTL: a budget for the
key's whole life) or ``spent:{KEY}:day:2026-12-03`` (one per period, kept
:data:`SPENT_KEPT_AFTER_PERIOD_S` past its end for ``usage --reconcile``), ``holds:{KEY}``
(a hash hold id → nanos) and ``holdexp:{KEY}`` (a sorted set hold id → expiry in ms): each script
first drops the expired holds, so a dead replica's holds stop counting at their expiry. The
API key's name in braces is the keys' hash tag: one script's keys are in one slot (Redis
Cluster runs a script only on those), and different API keys spread over the slots.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import trio

from trio_gateway.accounting.limits import RateDecision, covers, gcra
from trio_gateway.core.budget_period import LIFETIME, Period, same_kind
from trio_gateway.redis.client import RedisClient, RedisError

# Bounded in-process state: one entry per key of the keys file, which is bounded itself.
MAX_LOCAL_HOLDS_PER_KEY = 100_000
# A period's spend stays in Redis this long after the period ended: `usage --reconcile` can
# still compare the last one with the ledger, and Redis holds a few periods per key, not all.
SPENT_KEPT_AFTER_PERIOD_S = 7 * 86400.0


@attrs.frozen(kw_only=True)
class AdmitArgs:
    key: str
    rpm: int | None
    tpm: int | None
    tokens: int
    budget: int | None  # nanos; None: no budget
    hold: int  # nanos
    hold_id: str
    ttl_s: float
    # The budget's period now: its spend is what the budget is checked against.
    period: Period = LIFETIME


@attrs.frozen(kw_only=True)
class AdmitResult:
    refused: str | None  # None, "rate" or "budget"
    requests: RateDecision | None = None
    tokens: RateDecision | None = None
    retry_after_s: float = 0.0
    available: int = 0  # nanos left after this hold (or before it, when refused)


class LimitStore(Protocol):
    async def admit(self, args: AdmitArgs) -> AdmitResult: ...

    async def settle(self, key: str, hold_id: str, cost: int, period: Period = LIFETIME) -> None:
        """``period``: the one the request started in (its record's ``started_at``)."""

    async def spent_in(self, key: str, period: Period) -> int:
        """What ``key`` has spent in ``period`` (settled; holds aside)."""


@attrs.define
class _KeyState:
    tat_requests: float = 0.0
    tat_tokens: float = 0.0
    spent: int = 0
    # The period ``spent`` is of; None: no spend known yet (a key with only rate limits).
    period: str | None = None
    holds: dict[str, tuple[int, float]] = attrs.field(factory=dict)  # id → (nanos, expires)


class MemoryStore:
    """The store of a gateway without Redis: this process's state. Each key's spend is of one
    period, the latest it saw (a new period renews it); it is rebuilt from the usage ledger at
    start (:meth:`seed`, accounting/spend.py), so a restart keeps it."""

    def __init__(self) -> None:
        self._keys: dict[str, _KeyState] = {}

    def _state(self, key: str, now: float) -> _KeyState:
        state = self._keys.setdefault(key, _KeyState())
        expired = [h for h, (_, until) in state.holds.items() if until <= now]
        for hold_id in expired:
            del state.holds[hold_id]
        return state

    def held(self, key: str) -> int:
        state = self._state(key, trio.current_time())
        return sum(n for n, _ in state.holds.values())

    def spent(self, key: str) -> int:
        return self._keys.get(key, _KeyState()).spent

    async def spent_in(self, key: str, period: Period) -> int:
        await trio.lowlevel.checkpoint()
        state = self._keys.get(key, _KeyState())
        return state.spent if state.period == period.id else 0

    def period_of_spend(self, key: str) -> str | None:
        return self._keys.get(key, _KeyState()).period

    def knows(self, key: str, period: Period) -> bool:
        """Whether ``key``'s spend in periods of ``period``'s kind is known: seeded, or counted
        here since. A later period of a known kind is a renewal, known to be 0 so far."""
        known = self._keys.get(key, _KeyState()).period
        return known is not None and same_kind(known, period.id)

    def seed(self, key: str, period: Period, spent: int) -> None:
        """The spend the ledger knows of ``key`` in ``period``, unless this store learned it
        meanwhile (another request's seed, or a settle)."""
        state = self._keys.setdefault(key, _KeyState())
        if state.period is None or not same_kind(state.period, period.id):
            state.period, state.spent = period.id, spent

    async def admit(self, args: AdmitArgs) -> AdmitResult:
        await trio.lowlevel.checkpoint()
        # No await below: the check and the take are one atomic step, as the Lua script is.
        now = trio.current_time()
        state = self._state(args.key, now)
        req = gcra(state.tat_requests, now, args.rpm, 1) if args.rpm else None
        tok = gcra(state.tat_tokens, now, args.tpm, args.tokens) if args.tpm else None
        waits = [d.retry_after_s for d in (req, tok) if d is not None and not d.allowed]
        held = sum(n for n, _ in state.holds.values())
        if waits:
            return AdmitResult(refused="rate", requests=req, tokens=tok, retry_after_s=max(waits))
        if args.budget is not None:
            if state.period != args.period.id:
                # Another period: the budget is whole again.
                state.period, state.spent = args.period.id, 0
            if not covers(args.budget, state.spent, held, args.hold) or (
                len(state.holds) >= MAX_LOCAL_HOLDS_PER_KEY
            ):
                available = max(args.budget - state.spent - held, 0)
                return AdmitResult(refused="budget", requests=req, tokens=tok, available=available)
            state.holds[args.hold_id] = (args.hold, now + args.ttl_s)
        if req is not None:
            state.tat_requests = req.tat
        if tok is not None:
            state.tat_tokens = tok.tat
        available = 0 if args.budget is None else args.budget - state.spent - held - args.hold
        return AdmitResult(refused=None, requests=req, tokens=tok, available=available)

    async def settle(self, key: str, hold_id: str, cost: int, period: Period = LIFETIME) -> None:
        await trio.lowlevel.checkpoint()
        state = self._state(key, trio.current_time())
        state.holds.pop(hold_id, None)
        if state.period == period.id:
            state.spent += cost
        elif state.period is None or (
            same_kind(state.period, period.id) and period.id > state.period
        ):
            # The request started in a period the store has not seen yet: it begins there.
            state.period, state.spent = period.id, cost
        # Else it started in a period that is over: it counts for nothing now (the ledger
        # keeps it).


# GCRA in Lua, as limits.gcra, in milliseconds. Returns allowed, remaining, reset, retry, tat.
_LUA_GCRA = """
local function gcra(tat, now, limit, cost)
  local interval = 60000 / limit
  if cost > limit then cost = limit end
  local base = math.max(tat, now)
  local new_tat = base + cost * interval
  local allow_at = new_tat - 60000
  if allow_at > now then
    local rem = math.floor((now + 60000 - base) / interval + 1e-9)
    return {0, math.max(0, math.min(limit, rem)), math.max(base - now, 0), allow_at - now, tat}
  end
  local rem = math.floor((now + 60000 - new_tat) / interval + 1e-9)
  return {1, math.max(0, math.min(limit, rem)), math.max(new_tat - now, 0), 0, new_tat}
end
local function purge(holds, exp, now)
  local dead = redis.call('ZRANGEBYSCORE', exp, '-inf', now)
  if #dead > 0 then
    redis.call('HDEL', holds, unpack(dead))
    redis.call('ZREM', exp, unpack(dead))
  end
end
"""

# KEYS: rl:req, rl:tok, spent, holds, holdexp.
# ARGV: rpm (0: none), tpm (0: none), tokens, budget (-1: none), hold, hold id, ttl ms.
ADMIT_SCRIPT = (
    _LUA_GCRA
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local budget, hold, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[7])
local req = {1, 0, 0, 0, 0}
local tok = {1, 0, 0, 0, 0}
if rpm > 0 then req = gcra(tonumber(redis.call('GET', KEYS[1]) or '0'), now, rpm, 1) end
if tpm > 0 then tok = gcra(tonumber(redis.call('GET', KEYS[2]) or '0'), now, tpm, tokens) end
local function answer(status, available)
  return {status, req[2], math.ceil(req[3]), tok[2], math.ceil(tok[3]),
          math.ceil(math.max(req[4], tok[4])), tostring(available)}
end
if req[1] == 0 or tok[1] == 0 then return answer(1, 0) end
local available = 0
if budget >= 0 then
  purge(KEYS[4], KEYS[5], now)
  local held = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[4])) do held = held + tonumber(v) end
  local spent = tonumber(redis.call('GET', KEYS[3]) or '0')
  if spent + held + hold > budget then return answer(2, math.max(budget - spent - held, 0)) end
  redis.call('HSET', KEYS[4], ARGV[6], hold)
  redis.call('ZADD', KEYS[5], now + ttl, ARGV[6])
  -- The hash outlives its newest hold by its TTL at most: a dead replica leaves nothing.
  redis.call('PEXPIRE', KEYS[4], ttl)
  redis.call('PEXPIRE', KEYS[5], ttl)
  available = budget - spent - held - hold
end
if rpm > 0 then redis.call('SET', KEYS[1], req[5], 'PX', math.ceil(req[5] - now) + 60000) end
if tpm > 0 then redis.call('SET', KEYS[2], tok[5], 'PX', math.ceil(tok[5] - now) + 60000) end
return answer(0, available)
"""
)

# KEYS: spent (of the request's period), holds, holdexp. ARGV: hold id, cost, the spent key's
# expiry in ms since the epoch (0: none, a budget for the key's whole life).
SETTLE_SCRIPT = """
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local spent = redis.call('INCRBY', KEYS[1], ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIREAT', KEYS[1], ARGV[3]) end
return spent
"""


def _int(value: object) -> int:
    if isinstance(value, bytes):
        return int(float(value))
    if isinstance(value, int):
        return value
    raise RedisError(f"unexpected reply {value!r}")


class RedisStore:
    """The shared store: every replica's admits and settles go through the same Lua scripts.
    The caller puts a deadline around each call (limit_store.Limits)."""

    def __init__(self, client: RedisClient, prefix: str = "tgw:") -> None:
        self.client = client
        self.prefix = prefix

    def _keys(self, key: str, period: Period = LIFETIME) -> list[str]:
        p, tag = self.prefix, f"{{{key}}}"
        spent = self.spent_key(key, period)
        return [f"{p}rl:req:{tag}", f"{p}rl:tok:{tag}", spent, *self._hold_keys(key)]

    def spent_key(self, key: str, period: Period = LIFETIME) -> str:
        """``spent:{KEY}`` for a budget for the key's whole life (as before periods existed),
        ``spent:{KEY}:day:2026-12-03`` for one period."""
        suffix = "" if period.end is None else f":{period.id}"
        return f"{self.prefix}spent:{{{key}}}{suffix}"

    def _hold_keys(self, key: str) -> list[str]:
        tag = f"{{{key}}}"
        return [f"{self.prefix}holds:{tag}", f"{self.prefix}holdexp:{tag}"]

    async def admit(self, args: AdmitArgs) -> AdmitResult:
        reply = await self.client.run_script(
            ADMIT_SCRIPT,
            self._keys(args.key, args.period),
            [
                args.rpm or 0,
                args.tpm or 0,
                args.tokens,
                -1 if args.budget is None else args.budget,
                args.hold,
                args.hold_id,
                max(1, round(args.ttl_s * 1000)),
            ],
        )
        if not isinstance(reply, list) or len(reply) != 7:
            raise RedisError(f"unexpected admit reply {reply!r}")
        status, req_rem, req_reset, tok_rem, tok_reset, retry, available = map(_int, reply)
        retry_s = retry / 1000
        req = tok = None
        if args.rpm:
            req = _decision(status, args.rpm, req_rem, req_reset)
        if args.tpm:
            tok = _decision(status, args.tpm, tok_rem, tok_reset)
        refused = {0: None, 1: "rate", 2: "budget"}[status]
        return AdmitResult(
            refused=refused, requests=req, tokens=tok, retry_after_s=retry_s, available=available
        )

    async def settle(self, key: str, hold_id: str, cost: int, period: Period = LIFETIME) -> None:
        spent, holds, exp = self._keys(key, period)[2:]
        expire_at_ms = 0
        if period.end is not None:
            expire_at_ms = round((period.end + SPENT_KEPT_AFTER_PERIOD_S) * 1000)
        await self.client.run_script(
            SETTLE_SCRIPT, [spent, holds, exp], [hold_id, cost, expire_at_ms]
        )

    async def spent_in(self, key: str, period: Period = LIFETIME) -> int:
        return await self.client.get_int(self.spent_key(key, period))

    async def spent(self, key: str) -> int:
        """A budget for the key's whole life: its spend."""
        return await self.spent_in(key)

    async def live_holds(self, key: str) -> int:
        return await self.client.hash_len(self._hold_keys(key)[0])


def _decision(status: int, limit: int, remaining: int, reset_ms: int) -> RateDecision:
    # Only the header values matter here; the state stays in Redis.
    return RateDecision(
        allowed=status != 1,
        limit=limit,
        remaining=remaining,
        reset_s=reset_ms / 1000,
        retry_after_s=0.0,
        tat=0.0,
    )
