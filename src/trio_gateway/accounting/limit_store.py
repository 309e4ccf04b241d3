"""Where budgets and rate limits keep their state: in this process, or in Redis (shared).

Both stores answer the same two calls with the same meaning:

- ``admit``: atomically, check the key's requests/min and tokens/min (GCRA, limits.py) and
  whether its budget covers ``budget - spent - live holds >= hold``; if everything passes, take
  the rate units and place the hold (which expires after ``ttl_s``: a replica that dies
  mid-request leaves no hold behind). Nothing is taken when anything refuses.
- ``settle``: add the real cost to ``spent`` and delete the hold.

Redis keys, under a prefix (default ``tgw:``): ``rl:req:{KEY}`` and ``rl:tok:{KEY}`` (the GCRA
``tat`` in ms, with a TTL of a minute past it), ``spent:{KEY}`` (nanos, no TTL), ``holds:{KEY}``
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
from trio_gateway.redis.client import RedisClient, RedisError

# Bounded in-process state: one entry per key of the keys file, which is bounded itself.
MAX_LOCAL_HOLDS_PER_KEY = 100_000


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


@attrs.frozen(kw_only=True)
class AdmitResult:
    refused: str | None  # None, "rate" or "budget"
    requests: RateDecision | None = None
    tokens: RateDecision | None = None
    retry_after_s: float = 0.0
    available: int = 0  # nanos left after this hold (or before it, when refused)


class LimitStore(Protocol):
    async def admit(self, args: AdmitArgs) -> AdmitResult: ...

    async def settle(self, key: str, hold_id: str, cost: int) -> None: ...


@attrs.define
class _KeyState:
    tat_requests: float = 0.0
    tat_tokens: float = 0.0
    spent: int = 0
    holds: dict[str, tuple[int, float]] = attrs.field(factory=dict)  # id → (nanos, expires)


class MemoryStore:
    """The store of a gateway without Redis: this process's state, lost on restart."""

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

    async def settle(self, key: str, hold_id: str, cost: int) -> None:
        await trio.lowlevel.checkpoint()
        state = self._state(key, trio.current_time())
        state.holds.pop(hold_id, None)
        state.spent += cost


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

# KEYS: spent, holds, holdexp. ARGV: hold id, cost.
SETTLE_SCRIPT = """
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return redis.call('INCRBY', KEYS[1], ARGV[2])
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

    def _keys(self, key: str) -> list[str]:
        p, tag = self.prefix, f"{{{key}}}"
        return [f"{p}rl:req:{tag}", f"{p}rl:tok:{tag}", f"{p}spent:{tag}", *self._hold_keys(key)]

    def _hold_keys(self, key: str) -> list[str]:
        tag = f"{{{key}}}"
        return [f"{self.prefix}holds:{tag}", f"{self.prefix}holdexp:{tag}"]

    async def admit(self, args: AdmitArgs) -> AdmitResult:
        reply = await self.client.run_script(
            ADMIT_SCRIPT,
            self._keys(args.key),
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

    async def settle(self, key: str, hold_id: str, cost: int) -> None:
        spent, holds, exp = self._keys(key)[2:]
        await self.client.run_script(SETTLE_SCRIPT, [spent, holds, exp], [hold_id, cost])

    async def spent(self, key: str) -> int:
        return await self.client.get_int(self._keys(key)[2])

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
