"""Routing decisions: which providers of an alias may answer a request, and in which order."""

from __future__ import annotations

import random
from collections.abc import Sequence

from trio_gateway.config.schema import AliasConfig, ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import CapabilityUnavailable, ModelNotFound, UnsupportedEndpoint
from trio_gateway.core.kind import RequestKind
from trio_gateway.providers.registry import serves


def resolve_alias(aliases: dict[str, AliasConfig], name: str) -> AliasConfig:
    try:
        return aliases[name]
    except KeyError:
        known = ", ".join(sorted(aliases)) or "(none)"
        raise ModelNotFound(
            f"unknown model {name!r}; this gateway serves the aliases: {known}", param="model"
        ) from None


def eligible_providers(
    alias_name: str,
    alias: AliasConfig,
    required: frozenset[Capability],
    kind: RequestKind = RequestKind.CHAT,
) -> list[ProviderConfig]:
    """Providers able to serve a request of ``kind`` that needs ``required``; capability (or
    endpoint) errors otherwise.

    Filtering happens before choosing, so a request never lands on a provider that would
    silently ignore its tools, images or schema, or that does not speak its endpoint.
    """
    providers: Sequence[ProviderConfig] = alias.providers
    if kind is not RequestKind.CHAT:
        providers = [p for p in providers if serves(p.type, kind)]
        if not providers:
            types = ", ".join(f"{p.name} is {p.type}" for p in alias.providers)
            raise UnsupportedEndpoint(
                f"no provider of alias {alias_name!r} serves {kind.path} ({types}; only "
                "openai_compatible and openai providers do)",
                param="model",
            )
    eligible = [p for p in providers if required <= p.capabilities]
    if eligible:
        return eligible
    wanted = ", ".join(sorted(c.value for c in required))
    offers = "; ".join(
        f"{p.name} offers {', '.join(sorted(c.value for c in p.capabilities)) or 'nothing extra'}"
        for p in alias.providers
    )
    missing = sorted(
        c.value for c in required if not any(c in p.capabilities for p in alias.providers)
    )
    what = (
        f"no provider of alias {alias_name!r} offers {', '.join(missing)}"
        if missing
        else f"no single provider of alias {alias_name!r} offers all of {wanted}"
    )
    raise CapabilityUnavailable(f"{what} ({offers})", param="model")


def attempt_order(providers: Sequence[ProviderConfig], rng: random.Random) -> list[ProviderConfig]:
    """Weighted order among weight > 0 providers, then the weight-0 fallbacks as listed.

    The first pick is proportional to weight; so is each next one among those left, which
    makes failover spread the same way the traffic does.
    """
    pool = [p for p in providers if p.weight > 0]
    order: list[ProviderConfig] = []
    if len(pool) == 1 and len(providers) == 1:
        # One provider: the order is known, but the draw is made all the same, so that a
        # seeded generator gives every later request the order it gave before.
        rng.uniform(0, pool[0].weight)
        return pool
    while pool:
        total = sum(p.weight for p in pool)
        pick = rng.uniform(0, total)
        acc = 0.0
        for i, p in enumerate(pool):
            acc += p.weight
            if pick <= acc:
                order.append(pool.pop(i))
                break
        else:
            order.append(pool.pop())
    order.extend(p for p in providers if p.weight == 0)
    return order


def order_by_health(
    eligible: Sequence[ProviderConfig], in_rotation: set[str], rng: random.Random
) -> list[ProviderConfig]:
    """Weighted choice among providers in rotation (weight > 0), then the rest of the weight > 0
    providers by weight (unhealthy or cooling down: a last resort, not a first choice), then
    the weight-0 fallbacks, those in rotation first."""
    live: list[ProviderConfig] = []
    resting: list[ProviderConfig] = []
    live_fallbacks: list[ProviderConfig] = []
    resting_fallbacks: list[ProviderConfig] = []
    # One pass, not four: the same lists in the same order (config checks weights are >= 0).
    for p in eligible:
        if p.name in in_rotation:
            (live if p.weight > 0 else live_fallbacks).append(p)
        else:
            (resting if p.weight > 0 else resting_fallbacks).append(p)
    order = attempt_order(live, rng)
    if resting:
        order += sorted(resting, key=lambda p: -p.weight)
    return order + live_fallbacks + resting_fallbacks
