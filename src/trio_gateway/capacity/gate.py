"""A provider's admission gate: ``max_inflight`` slots, in this process or shared by every
gateway process through Redis. ``LocalGate`` is a ``PriorityLimiter`` (priority.py: waiters
served by rank, lowest first, FIFO within a rank). ``SharedGate`` first takes a slot of its own
``PriorityLimiter``, so no process exceeds the limit on its own, then a *lease* in Redis, so
that all together do not either (3 processes allowing 8 put 8 upstream). Ranks order the
waiters of one process; across processes a lease goes to whichever asks first.

Redis keys, under a prefix (``[redis] key_prefix``), all with the hash tag ``{lease}``: a script
touches a gate's key and ``{lease}:procs`` together, and a Redis Cluster (or a managed Redis that
checks slots) runs a script only on keys of one slot.

- ``{lease}:KEY`` — a sorted set, one member ``PROCESS_ID:N`` per slot held anywhere, scored by
  its expiry in ms. Each script first drops the expired members, then compares the count with
  the limit passed in *that* call (processes reloading to another limit disagree only briefly).
  The key itself expires with its longest-lived member.
- ``{lease}:capped:KEY`` — the members of ``{lease}:KEY`` held by the capped class of a
  ``Reservation`` (priority.py), scored alike: a capped borrower is granted a lease only while
  this set counts fewer than ``max_inflight - slots``, so the reservation holds cluster-wide.
- ``{lease}:procs`` — a sorted set process id → expiry in ms: the live gateway processes, which
  every acquire and renewal heartbeats. Their number (``peers``) sizes the fallback share.

Time is Redis's (``TIME`` inside the scripts): the gateways' clocks may disagree, Redis's is one.

A lease lives ``lease_ttl_s`` unless renewed, and ``LeaseBroker.serve`` renews this process's
leases every ``lease_ttl_s / 3``. A process that dies, even by SIGKILL, stops renewing: its
slots come back within ``lease_ttl_s``. A renewal only extends members that still exist (``ZADD
XX``): a lease that expired while its holder was stalled stays gone and is counted in
``lost_leases`` (its request goes on; the cluster may briefly run one over the limit).

When Redis fails (an error, or no answer within ``timeout_s`` at the call site):

- ``on_error = "share"``: a gate grants up to ``max(1, max_inflight // peers)`` slots in this
  process (``peers`` as last seen, 1 if never), without leases; of them the capped class at
  most ``max(1, (max_inflight - reserved) // peers)``. Slots taken so stay leaseless
  after Redis is back; new ones are leased again from the first answer on.
- ``on_error = "refuse"``: nothing is granted while Redis fails; ``acquire`` keeps trying with
  backoff until its caller's deadline cancels it.
- ``release`` never raises: a lease it could not remove expires, as it is no longer renewed.
- ``serve`` skips a failed round and tries again at the next one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import socket
from typing import Literal

import attrs
import trio

from trio_gateway.capacity.priority import NO_RESERVATION, PriorityLimiter, Reservation
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.redis.client import RedisClient, RedisError, Value

log = logging.getLogger("trio_gateway")

# Waiting for a lease (the cluster is full): poll again after 10 ms, doubling up to 200 ms. A
# slot held by another process frees at that process's pace, which we cannot hear about; the
# cap bounds the added wait to 200 ms and a full gate's cost to 5 scripts/s per waiter. A
# release in this process wakes its waiters at once (no poll delay).
POLL_START_S = 0.010
POLL_MAX_S = 0.200
# Leases are renewed this many times per TTL: two renewals in a row may fail (or be late)
# before a live holder's lease expires.
RENEWALS_PER_TTL = 3

_LUA_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The key lives as long as its longest-lived member, whatever TTL each process configured.
local function keep_until_last(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIREAT', key, last[2]) end
end
local function heartbeat(procs, id, now, ttl)
  redis.call('ZREMRANGEBYSCORE', procs, '-inf', now)
  redis.call('ZADD', procs, now + ttl, id)
  keep_until_last(procs)
  return redis.call('ZCARD', procs)
end
"""

# KEYS: lease set, procs, and for a capped borrower the capped set. ARGV: member, limit, ttl
# ms, process id, and for a capped borrower the capped class's limit.
# Returns granted (0/1), leases held cluster-wide after this call, live processes.
ACQUIRE_SCRIPT = (
    _LUA_COMMON
    + """
local now = now_ms()
local ttl = tonumber(ARGV[3])
local peers = heartbeat(KEYS[2], ARGV[4], now, ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[2]) then return {0, held, peers} end
if KEYS[3] then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[5]) then return {0, held, peers} end
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[1])
  keep_until_last(KEYS[3])
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
keep_until_last(KEYS[1])
return {1, held + 1, peers}
"""
)

# KEYS: lease set, capped set. ARGV: member. Returns the leases left cluster-wide.
RELEASE_SCRIPT = (
    _LUA_COMMON
    + """
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
return {redis.call('ZCARD', KEYS[1])}
"""
)

# KEYS: procs, and the lease set and the capped set when there are leases to renew. ARGV:
# process id, ttl ms,
# members. Returns live processes, leases held cluster-wide (-1: no lease set), then the
# members that were gone (expired, or lost with a Redis restart).
RENEW_SCRIPT = (
    _LUA_COMMON
    + """
local now = now_ms()
local ttl = tonumber(ARGV[2])
local reply = {heartbeat(KEYS[1], ARGV[1], now, ttl), -1}
if #KEYS < 2 then return reply end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
for i = 3, #ARGV do
  if redis.call('ZSCORE', KEYS[2], ARGV[i]) then
    redis.call('ZADD', KEYS[2], 'XX', now + ttl, ARGV[i])
    redis.call('ZADD', KEYS[3], 'XX', now + ttl, ARGV[i])
  else
    reply[#reply + 1] = ARGV[i]
  end
end
keep_until_last(KEYS[2])
keep_until_last(KEYS[3])
reply[2] = redis.call('ZCARD', KEYS[2])
return reply
"""
)


@attrs.frozen
class GateStats:
    in_flight: int  # slots this process holds
    waiting: int  # tasks of this process waiting for a slot
    max_inflight: int


def reservation_of(config: ProviderConfig) -> Reservation:
    """The provider's reservation, as its gates hold it (each kind for the whole host or
    cluster: no process takes a share of it)."""
    if config.reserved_for_priority_at_most is None or config.reserved_slots == 0:
        return NO_RESERVATION
    return Reservation(config.reserved_slots, config.reserved_for_priority_at_most)


def _take_local(limiter: PriorityLimiter, borrower: object, priority: int) -> bool:
    try:
        limiter.acquire_on_behalf_of_nowait(borrower, priority)
    except trio.WouldBlock:
        return False
    return True


def _release_local(limiter: PriorityLimiter, borrower: object) -> None:
    # Not a holder: a second release, or one after a cancelled acquire. Releasing runs in
    # cleanup code, where raising would hide the error that brought us there.
    with contextlib.suppress(RuntimeError):
        limiter.release_on_behalf_of(borrower)


class LocalGate:
    """Per process: a PriorityLimiter."""

    def __init__(self, max_inflight: int, reservation: Reservation = NO_RESERVATION) -> None:
        self._limiter = PriorityLimiter(max_inflight, reservation)

    def try_acquire_nowait(self, borrower: object, priority: int = 0) -> bool:
        return _take_local(self._limiter, borrower, priority)

    async def try_acquire(self, borrower: object, priority: int = 0) -> bool:
        # Cancellation is checked before the take, never after: a granted slot is returned.
        await trio.lowlevel.checkpoint_if_cancelled()
        granted = self.try_acquire_nowait(borrower, priority)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return granted

    async def acquire(self, borrower: object, rank: float | None = None, priority: int = 0) -> None:
        """A slot, waiting behind every waiter of a lower ``rank`` that may take it (priority.py:
        ``priority`` says whether this borrower may use the reserved slots)."""
        await self._limiter.acquire_on_behalf_of(borrower, rank, priority)

    def release_nowait(self, borrower: object) -> None:
        """Release without a schedule point (tests free several gates in one instant)."""
        _release_local(self._limiter, borrower)

    async def release(self, borrower: object) -> None:
        _release_local(self._limiter, borrower)
        # A schedule point that cannot raise Cancelled: release runs in `finally` blocks.
        await trio.lowlevel.cancel_shielded_checkpoint()

    def resize(self, max_inflight: int, reservation: Reservation = NO_RESERVATION) -> None:
        self._limiter.resize(max_inflight, reservation)

    def statistics(self) -> GateStats:
        stats = self._limiter.statistics()
        return GateStats(stats.borrowed_tokens, stats.tasks_waiting, stats.total_tokens)


class SharedGate:
    """One provider's slots, leased in Redis; see the module docstring. Made by
    ``LeaseBroker.gate``."""

    def __init__(
        self,
        broker: LeaseBroker,
        key: str,
        max_inflight: int,
        reservation: Reservation = NO_RESERVATION,
    ) -> None:
        self.key = key
        # Leases held cluster-wide, as the last script that answered counted them.
        self.cluster_in_flight: int | None = None
        self._broker = broker
        self._redis_key = f"{broker.key_prefix}{{lease}}:{key}"
        self._capped_key = f"{broker.key_prefix}{{lease}}:capped:{key}"
        self._limiter = PriorityLimiter(max_inflight, reservation)
        # Granted borrowers → their lease; None: no lease (granted in fallback, or lost).
        self._granted: dict[object, str | None] = {}
        self._capped_granted: set[object] = set()
        # Borrowers holding a local slot while they wait for a lease → their (rank, arrival,
        # capped): only the first of them asks Redis (and the first privileged one, when the
        # first is capped: the cluster may have a reserved lease free), so that the cluster's
        # next free lease goes to the best waiter of this process that may take it, not to
        # whichever poll comes first.
        self._pollers: dict[object, tuple[float, int, bool]] = {}
        self._arrivals = itertools.count()
        self._released = trio.Event()

    @property
    def max_inflight(self) -> int:
        return self._limiter.total_tokens

    @property
    def reservation(self) -> Reservation:
        return self._limiter.reservation

    def try_acquire_nowait(self, borrower: object, priority: int = 0) -> bool:
        """Without a round trip only a fallback slot can be granted (policy ``share`` while
        Redis fails); otherwise False: use ``try_acquire``."""
        broker = self._broker
        if not (broker.fallback_active() and broker.on_error == "share"):
            return False
        capped = self._limiter.reservation.capped(priority)
        if not self._within_share(capped) or not _take_local(self._limiter, borrower, priority):
            return False
        self._grant(borrower, None, capped)
        return True

    async def try_acquire(self, borrower: object, priority: int = 0) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        capped = self._limiter.reservation.capped(priority)
        # Someone of this process waits for a lease it may take: a newcomer does not go
        # before it (a capped waiter does not hold up a privileged newcomer).
        ahead = any(capped or not c for _, _, c in self._pollers.values())
        if ahead or not _take_local(self._limiter, borrower, priority):
            await trio.lowlevel.cancel_shielded_checkpoint()
            return False
        granted = False
        try:
            granted = await self._attempt(borrower, capped)
        finally:
            if not granted:
                _release_local(self._limiter, borrower)
        return granted

    async def acquire(self, borrower: object, rank: float | None = None, priority: int = 0) -> None:
        """A local slot in rank order (priority.py), then a lease: asked of Redis by the first
        waiter in rank order only (and the first privileged one), the others waiting for their
        turn."""
        if rank is None:
            rank = trio.current_time()
        capped = self._limiter.reservation.capped(priority)
        await self._limiter.acquire_on_behalf_of(borrower, rank, priority)
        granted = False
        self._pollers[borrower] = (rank, next(self._arrivals), capped)
        try:
            delay = POLL_START_S
            while True:
                # Taken before the attempt: a release during the round trip wakes us too.
                wake = self._released
                if borrower in self._turn():
                    if await self._attempt(borrower, capped):
                        granted = True
                        return
                    with trio.move_on_after(delay):
                        await wake.wait()
                    delay = min(delay * 2, POLL_MAX_S)
                else:
                    await wake.wait()  # a release here, or the first poller leaving
        finally:
            del self._pollers[borrower]
            self._wake()  # the next poller's turn, at once
            if not granted:
                # Cancelled while waiting (a lease granted mid-call was removed in _attempt).
                _release_local(self._limiter, borrower)

    async def release(self, borrower: object) -> None:
        if borrower not in self._granted:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        # Out of _granted before the round trip: a renewal running meanwhile must not count
        # this lease as lost when it finds it gone.
        member = self._granted.pop(borrower)
        self._capped_granted.discard(borrower)
        try:
            if member is None:
                await trio.lowlevel.cancel_shielded_checkpoint()
            else:
                # Cleanup runs even when the request was cancelled; the call's own timeout_s
                # (inside _call) bounds it. On failure the lease expires unrenewed.
                with trio.CancelScope(shield=True):
                    reply = await self._broker._call(
                        RELEASE_SCRIPT, [self._redis_key, self._capped_key], [member], ints=1
                    )
                if reply is not None:
                    self.cluster_in_flight = reply[0][0]
        finally:
            _release_local(self._limiter, borrower)
            self._wake()

    def resize(self, max_inflight: int, reservation: Reservation = NO_RESERVATION) -> None:
        self._limiter.resize(max_inflight, reservation)
        self._wake()

    def statistics(self) -> GateStats:
        stats = self._limiter.statistics()
        # A task holding a local slot while it polls Redis is waiting, not in flight.
        return GateStats(
            in_flight=len(self._granted),
            waiting=stats.tasks_waiting + len(self._pollers),
            max_inflight=self.max_inflight,
        )

    def _turn(self) -> tuple[object, ...]:
        """The pollers who ask Redis: the first in rank order, and when it is capped the first
        privileged one too (a reserved lease may be free that the capped one cannot take)."""
        first = min(self._pollers, key=self._pollers.__getitem__)
        if not self._pollers[first][2]:
            return (first,)
        privileged = [b for b, (_, _, capped) in self._pollers.items() if not capped]
        if not privileged:
            return (first,)
        return (first, min(privileged, key=self._pollers.__getitem__))

    def _within_share(self, capped: bool) -> bool:
        """Room in this process's fallback share (Redis failing, policy ``share``)."""
        peers = self._broker.peers
        if len(self._granted) >= max(1, self.max_inflight // peers):
            return False
        unreserved = self.max_inflight - self._limiter.reservation.slots
        return not capped or len(self._capped_granted) < max(1, unreserved // peers)

    def _grant(self, borrower: object, member: str | None, capped: bool) -> None:
        self._granted[borrower] = member
        if capped:
            self._capped_granted.add(borrower)

    def _wake(self) -> None:
        self._released.set()
        self._released = trio.Event()

    async def _attempt(self, borrower: object, capped: bool) -> bool:
        """One try for ``borrower``, which holds a local slot: a lease, or a fallback slot."""
        broker = self._broker
        member = f"{broker.process_id}:{next(broker._serial)}"
        keys = [self._redis_key, broker._procs_key]
        args: list[Value] = [member, self.max_inflight, broker._ttl_ms, broker.process_id]
        if capped:
            keys.append(self._capped_key)
            args.append(self.max_inflight - self._limiter.reservation.slots)
        try:
            reply = await broker._call(ACQUIRE_SCRIPT, keys, args, ints=3)
        except trio.Cancelled:
            # Cancelled mid-call (a lost race for a slot elsewhere, a client gone): Redis may
            # have granted the lease without our reading the reply. Removing it now, rather
            # than leaving it to expire, keeps the cluster's slot free for others.
            with trio.CancelScope(shield=True):
                await broker._call(
                    RELEASE_SCRIPT, [self._redis_key, self._capped_key], [member], ints=1
                )
            raise
        if reply is None:
            if broker.on_error == "share" and self._within_share(capped):
                self._grant(borrower, None, capped)
                return True
            return False
        granted, held, peers = reply[0]
        broker.peers = max(1, peers)
        self.cluster_in_flight = held
        if granted:
            self._grant(borrower, member, capped)
        return bool(granted)

    def _lost(self, members: set[str]) -> None:
        for borrower, member in self._granted.items():
            if member is not None and member in members:
                self._granted[borrower] = None
                self._broker.lost_leases += 1


class LeaseBroker:
    """One per gateway process: the Redis client, the policy, this process's id, the gates."""

    def __init__(
        self,
        redis: RedisClient,
        *,
        key_prefix: str,
        lease_ttl_s: float,
        timeout_s: float,
        on_error: Literal["share", "refuse"],
        process_id: str | None = None,
    ) -> None:
        if lease_ttl_s <= 0 or timeout_s <= 0:
            raise ValueError("lease_ttl_s and timeout_s must be > 0")
        if on_error not in ("share", "refuse"):
            raise ValueError(f"on_error must be 'share' or 'refuse', not {on_error!r}")
        self.redis = redis
        self.key_prefix = key_prefix
        self.lease_ttl_s = lease_ttl_s
        self.timeout_s = timeout_s
        self.on_error = on_error
        # Host and pid tell an operator reading the lease set whose slots these are; the
        # random part keeps a restarted process with a reused pid apart from its predecessor.
        self.process_id = process_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        )
        self.round_trips = 0
        self.errors = 0
        self.lost_leases = 0
        self.peers = 1
        self._failing = False
        self._gates: dict[str, SharedGate] = {}
        self._serial = itertools.count()
        self._ttl_ms = max(1, round(lease_ttl_s * 1000))
        self._procs_key = f"{key_prefix}{{lease}}:procs"

    def gate(
        self, key: str, max_inflight: int, reservation: Reservation = NO_RESERVATION
    ) -> SharedGate:
        """The gate of ``key``; the same object for the same key, resized to ``max_inflight``
        and ``reservation`` when a reload changed them."""
        if key == "procs" or key.startswith("capped:"):
            raise ValueError(f"{key!r}: procs and capped:* are the gateway's own lease keys")
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = SharedGate(self, key, max_inflight, reservation)
        elif (gate.max_inflight, gate.reservation) != (max_inflight, reservation):
            gate.resize(max_inflight, reservation)
        return gate

    def gates(self) -> list[SharedGate]:
        return list(self._gates.values())

    def fallback_active(self) -> bool:
        return self._failing

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew this process's leases and heartbeat it, every ``lease_ttl_s / 3``, until
        cancelled."""
        task_status.started()
        interval = self.lease_ttl_s / RENEWALS_PER_TTL
        next_at = trio.current_time()
        while True:
            await self._renew()
            # On a fixed cadence, so that slow rounds do not push renewals towards the expiry.
            next_at = max(next_at + interval, trio.current_time())
            await trio.sleep_until(next_at)

    async def _renew(self) -> None:
        # Every gate, with leases to renew or not: an idle one's cluster count (a gauge) is
        # refreshed too, so it is never older than a renewal interval. An idle process
        # heartbeats as well: it is a peer, and its fallback share stays reserved.
        rounds: list[tuple[SharedGate | None, list[str]]] = [
            (gate, [m for m in gate._granted.values() if m is not None])
            for gate in self._gates.values()
        ] or [(None, [])]
        for gate, members in rounds:
            keys = [self._procs_key]
            if gate is not None:
                keys += [gate._redis_key, gate._capped_key]
            reply = await self._call(
                RENEW_SCRIPT, keys, [self.process_id, self._ttl_ms, *members], ints=2
            )
            if reply is None:
                return  # the rest of the round would fail too; the next round retries
            (peers, count), gone = reply
            self.peers = max(1, peers)
            if gate is not None:
                gate.cluster_in_flight = count
                gate._lost(set(gone))

    async def _call(
        self, source: str, keys: list[str], args: list[Value], *, ints: int
    ) -> tuple[list[int], list[str]] | None:
        """One script: its first ``ints`` values as ints and the rest as strings, or None when
        Redis failed or was late (counted)."""
        self.round_trips += 1
        try:
            with trio.fail_after(self.timeout_s):
                reply = await self.redis.run_script(source, keys, args)
            parsed = _parse(reply, ints)
        except (RedisError, trio.TooSlowError) as exc:
            self.errors += 1
            if not self._failing:
                self._failing = True
                problem = str(exc) or f"no answer within {self.timeout_s}s"
                log.warning(
                    "admission leases: redis failing (%s); on_error=%s", problem, self.on_error
                )
            return None
        if self._failing:
            self._failing = False
            log.warning("admission leases: redis answers again")
        return parsed


def _parse(reply: object, ints: int) -> tuple[list[int], list[str]]:
    if not isinstance(reply, list) or len(reply) < ints:
        raise RedisError(f"unexpected lease script reply {reply!r}")
    head = reply[:ints]
    if not all(isinstance(v, int) for v in head):
        raise RedisError(f"unexpected lease script reply {reply!r}")
    rest = [v.decode() if isinstance(v, bytes) else str(v) for v in reply[ints:]]
    return [int(v) for v in head], rest
