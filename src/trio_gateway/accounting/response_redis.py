"""Stored responses in Redis (``[redis]``), shared by every worker and replica; time and expiry
are Redis's own.

Keys, under the prefix and the owner's tag (the first 16 hex digits of the SHA-256 of the
owner's name, in braces: every key of one owner is in one Redis Cluster slot, so each script
runs on one node)::

    <prefix>resp:{TAG}:r:<id>   hash: prev (the id it continued, "" for none), bytes, body;
                                expires (PEXPIRE) store_ttl_s after its last use
    <prefix>resp:{TAG}:index    sorted set: id → when its record expires (ms), oldest use first
    <prefix>resp:{TAG}:sizes    hash: id → bytes
    <prefix>resp:{TAG}:bytes    the owner's bytes, for the quota

A write drops the index's expired entries, then the owner's oldest records until the new one
fits ``key_quota_bytes``; a walk reads ``prev`` and ``bytes`` back to the chain's start (or a
bound), then the bodies, and moves each record's expiry on. The index keys expire with the
owner's newest record. The first layout's keys (``<prefix>resp:<tag>:<id>``, strings holding
the whole conversation) are not read: they expire on their own TTL.
"""

from __future__ import annotations

import hashlib

import trio

from trio_gateway.accounting.response_records import (
    Chain,
    ChainBounds,
    Record,
    Stored,
    StoreError,
    load_record,
)
from trio_gateway.redis.client import RedisClient, RedisError, Value

# Every script gets the owner's keys: KEYS = record, index, sizes, bytes.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
_FORGET = """
local function forget(id)
  local size = tonumber(redis.call('HGET', KEYS[3], id) or '0')
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('DECRBY', KEYS[4], size)
end
local function keep_index(ttl)
  for i = 2, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
"""
# ARGV: id, prev, body, bytes, ttl_ms, quota, record key prefix (the owner's, up to the id).
_PUT = (
    _NOW
    + _FORGET
    + """
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do forget(id) end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then forget(ARGV[1]) end
local size = tonumber(ARGV[4])
local held = tonumber(redis.call('GET', KEYS[4]) or '0')
local evicted = 0
while held + size > tonumber(ARGV[6]) do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #oldest == 0 then break end
  redis.call('DEL', ARGV[7] .. oldest[1])
  forget(oldest[1])
  held = tonumber(redis.call('GET', KEYS[4]) or '0')
  evicted = evicted + 1
end
redis.call('HSET', KEYS[1], 'prev', ARGV[2], 'bytes', ARGV[4], 'body', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('INCRBY', KEYS[4], size)
keep_index(ARGV[5])
return evicted
"""
)
_GET = "return redis.call('HGET', KEYS[1], 'body')"
# ARGV: id
_DELETE = (
    _FORGET
    + """
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
forget(ARGV[1])
return 1
"""
)
# ARGV: id, max turns, max bytes, ttl_ms, record key prefix. Returns {over, next, id, body, ...}:
# over 1 when the record named next would pass a bound; next "" at the chain's start.
_CHAIN = (
    _NOW
    + _FORGET
    + """
local ids, turns, size = {}, 0, 0
local id = ARGV[1]
local over = 0
while id ~= '' do
  local got = redis.call('HMGET', ARGV[5] .. id, 'prev', 'bytes')
  if not got[2] then break end
  local bytes = tonumber(got[2])
  if turns + 1 > tonumber(ARGV[2]) or size + bytes > tonumber(ARGV[3]) then
    over = 1
    break
  end
  turns, size = turns + 1, size + bytes
  ids[turns] = id
  id = got[1]
end
local reply = {over, id, size}
if over == 1 then return reply end
for _, one in ipairs(ids) do
  local key = ARGV[5] .. one
  reply[#reply + 1] = one
  reply[#reply + 1] = redis.call('HGET', key, 'body')
  redis.call('PEXPIRE', key, ARGV[4])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), one)
end
if turns > 0 then keep_index(ARGV[4]) end
return reply
"""
)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisResponseStore:
    """Records in Redis, each under its owner's tag, within ``key_quota_bytes`` per owner."""

    def __init__(
        self,
        client: RedisClient,
        prefix: str,
        *,
        ttl_s: float,
        key_quota_bytes: int,
        timeout_s: float,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._key_quota_bytes = key_quota_bytes
        self._timeout_s = timeout_s

    def _owner_keys(self, owner: str) -> tuple[str, list[str]]:
        """The owner's record key prefix, and its index, sizes and bytes keys."""
        tag = hashlib.sha256(owner.encode()).hexdigest()[:16]
        base = f"{self._prefix}resp:{{{tag}}}:"
        return base + "r:", [base + "index", base + "sizes", base + "bytes"]

    def keys(self, owner: str, response_id: str) -> list[str]:
        """The keys a script of this owner's record is given: record, index, sizes, bytes."""
        records, index = self._owner_keys(owner)
        return [records + response_id, *index]

    async def _call(self, script: str, keys: list[str], args: list[Value]) -> object:
        try:
            with trio.fail_after(self._timeout_s):
                return await self._client.run_script(script, keys, args)
        except (RedisError, trio.TooSlowError) as exc:
            raise StoreError(f"Redis did not answer: {exc or 'timed out'}") from exc

    async def put(self, owner: str, stored: Stored) -> None:
        records, _ = self._owner_keys(owner)
        args: list[Value] = [
            stored.id,
            stored.previous or "",
            stored.text,
            stored.size,
            self._ttl_ms,
            self._key_quota_bytes,
            records,
        ]
        await self._call(_PUT, self.keys(owner, stored.id), args)

    async def get(self, owner: str, response_id: str) -> Record | None:
        reply = await self._call(_GET, self.keys(owner, response_id)[:1], [])
        return None if reply is None else load_record(response_id, _text(reply))

    async def chain(self, owner: str, response_id: str, bounds: ChainBounds) -> Chain:
        records_prefix, _ = self._owner_keys(owner)
        args: list[Value] = [
            response_id,
            bounds.max_turns,
            bounds.max_bytes,
            self._ttl_ms,
            records_prefix,
        ]
        reply = await self._call(_CHAIN, self.keys(owner, response_id), args)
        if not isinstance(reply, list) or len(reply) < 3:
            raise StoreError(f"Redis answered the walk with {reply!r}")
        over, after, size, *pairs = reply
        following = _text(after) or None
        if over == 1:
            return Chain(next=following, over=True)
        records = tuple(
            load_record(_text(pairs[i]), _text(pairs[i + 1])) for i in range(0, len(pairs), 2)
        )
        return Chain(records=records, size=int(size), next=following)

    async def delete(self, owner: str, response_id: str) -> bool:
        return bool(await self._call(_DELETE, self.keys(owner, response_id), [response_id]))

    async def owner_bytes(self, owner: str) -> int:
        _, (_, _, held) = self._owner_keys(owner)
        reply = await self._call("return redis.call('GET', KEYS[1])", [held], [])
        return int(_text(reply)) if reply is not None else 0
