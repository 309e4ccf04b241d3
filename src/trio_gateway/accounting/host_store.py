"""Budgets and rate limits shared by the workers of one host, without Redis: a ``LimitStore``
whose every call goes to the supervisor's host broker (``process/host_broker.py``), which runs
the store the config has (``open_limits``: the in-process one, as a single gateway would) for
all of its workers. So a key's ``rpm``, ``tpm`` and budget hold across the host's workers as in
one process.

An admission is one round trip on a local socket (``LIMITS_ADMIT``, core/host_wire.py): the
``AdmitArgs`` and the ``AdmitResult`` as msgpack, field by field, so a field added to either
travels without a change here. A settlement is one write (``LIMITS_SETTLE``), not waited on.
When the broker is gone, an admission waits for the caller's deadline (``Limits`` turns that
into 503 ``limits_unavailable``) and a settlement is dropped (its hold went with the broker).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeAlias

import attrs
import msgspec
import trio

from trio_gateway.accounting.admission import Limits
from trio_gateway.accounting.limit_store import AdmitArgs, AdmitResult, LimitStore
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.core.budget_period import LIFETIME, Period
from trio_gateway.core.host_wire import LIMITS_ADMIT, LIMITS_SETTLE, LIMITS_SPENT

# A key's spend in a period, learnt from the usage ledger once (Limits.seed).
Seed: TypeAlias = Callable[[str, Period], Awaitable[None]]


class Link(Protocol):
    """The worker's connection to the broker (``capacity/host_link.HostLink``)."""

    def new_call(self) -> int: ...

    async def call(self, call: int, method: int, body: bytes) -> bytes: ...

    def post(self, method: int, body: bytes, call: int = 0) -> None: ...


class SettleBody(msgspec.Struct, array_like=True, frozen=True):
    key: str
    hold_id: str
    cost: int
    period: Period  # the one the request started in


class SpentBody(msgspec.Struct, array_like=True, frozen=True):
    key: str
    period: Period


_encode = msgspec.msgpack.Encoder().encode
_ADMIT_ARGS = msgspec.msgpack.Decoder(AdmitArgs)
_ADMIT_RESULT = msgspec.msgpack.Decoder(AdmitResult)
_SETTLE = msgspec.msgpack.Decoder(SettleBody)
_SPENT = msgspec.msgpack.Decoder(SpentBody)
_INT = msgspec.msgpack.Decoder(int)


class HostStore:
    """The worker's store: every call answered by the broker's."""

    def __init__(self, link: Link) -> None:
        self.link = link

    async def admit(self, args: AdmitArgs) -> AdmitResult:
        try:
            raw = await self.link.call(self.link.new_call(), LIMITS_ADMIT, _encode(args))
        except ConnectionError:
            # The broker is gone: no answer will come; the caller's deadline decides.
            await trio.sleep_forever()
        return _ADMIT_RESULT.decode(raw)

    async def settle(self, key: str, hold_id: str, cost: int, period: Period = LIFETIME) -> None:
        self.link.post(LIMITS_SETTLE, _encode(SettleBody(key, hold_id, cost, period)))
        await trio.lowlevel.checkpoint()

    async def spent_in(self, key: str, period: Period) -> int:
        try:
            raw = await self.link.call(
                self.link.new_call(), LIMITS_SPENT, _encode(SpentBody(key, period))
            )
        except ConnectionError:
            await trio.sleep_forever()
        return _INT.decode(raw)


@attrs.define
class WorkerHolds:
    """The budget holds one worker's requests have placed and not settled: what the broker
    settles at no cost when the worker is gone (its requests are gone with it)."""

    held: set[tuple[str, str]] = attrs.field(factory=set)


async def answer_admit(
    store: LimitStore, holds: WorkerHolds, body: bytes, seed: Seed | None = None
) -> bytes:
    """The broker's side of ``LIMITS_ADMIT``: the store's admission, encoded. ``seed``: learns
    a budgeted key's spend in its period from the usage ledger first, once (the workers'
    stores are the broker's, so the broker's is the one a restart rebuilds)."""
    args = _ADMIT_ARGS.decode(body)
    if seed is not None and args.budget is not None:
        await seed(args.key, args.period)
    result = await store.admit(args)
    if result.refused is None and args.budget is not None and args.hold_id:
        holds.held.add((args.key, args.hold_id))
    return _encode(result)


async def apply_settle(store: LimitStore, holds: WorkerHolds, body: bytes) -> None:
    """The broker's side of ``LIMITS_SETTLE``."""
    settle = _SETTLE.decode(body)
    holds.held.discard((settle.key, settle.hold_id))
    await store.settle(settle.key, settle.hold_id, settle.cost, settle.period)


async def answer_spent(store: LimitStore, body: bytes) -> bytes:
    """The broker's side of ``LIMITS_SPENT``: what the key spent in the period, encoded."""
    ask = _SPENT.decode(body)
    return _encode(await store.spent_in(ask.key, ask.period))


async def release_holds(store: LimitStore, holds: WorkerHolds) -> None:
    """A worker is gone: its holds stop counting now, not ``hold_ttl_s`` later. Its requests
    ended with it, unbilled, as a gateway's killed mid-request are with Redis."""
    held, holds.held = holds.held, set()
    for key, hold_id in held:
        await store.settle(key, hold_id, 0)


# The broker answers in microseconds; this bounds a broker that is gone. Generous, because the
# wait is on the worker's own clock: in an arrival storm its loop runs seconds late (scenario D),
# and the answer that came in time would be read late.
HOST_TIMEOUT_S = 10.0


def host_limits(config: GatewayConfig, link: Link) -> Limits:
    """A worker's limits: the supervisor's store, through ``link``."""
    return Limits(
        HostStore(link),
        timeout_s=HOST_TIMEOUT_S,
        fail_open=False,
        hold_ttl_s=config.limits.hold_ttl_s,
    )
