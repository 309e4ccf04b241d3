from __future__ import annotations

import random
from collections import Counter

import pytest

from trio_gateway.config import AliasConfig, Capability, ProviderConfig
from trio_gateway.errors import CapabilityUnavailable, ModelNotFound
from trio_gateway.routing import attempt_order, eligible_providers, order_by_health, resolve_alias

T, R, V = Capability.TOOLS, Capability.REASONING, Capability.VISION


def provider(name: str, weight: int, *caps: Capability) -> ProviderConfig:
    return ProviderConfig(
        name=name,
        type="openai_compatible",
        base_url="http://x/v1",
        model="m",
        weight=weight,
        capabilities=frozenset(caps),
    )


def test_unknown_alias_lists_the_aliases() -> None:
    aliases = {"b": AliasConfig(providers=()), "a": AliasConfig(providers=())}
    with pytest.raises(ModelNotFound, match=r"unknown model 'x'.*a, b"):
        resolve_alias(aliases, "x")


def test_capability_filter_happens_before_choosing() -> None:
    alias = AliasConfig(providers=(provider("plain", 100), provider("tooled", 1, T)))
    assert [p.name for p in eligible_providers("a", alias, frozenset({T}))] == ["tooled"]


def test_missing_capability_is_named() -> None:
    alias = AliasConfig(providers=(provider("p1", 100, T), provider("p2", 100, R)))
    with pytest.raises(CapabilityUnavailable, match="offers vision") as info:
        eligible_providers("a", alias, frozenset({V, T}))
    assert info.value.status == 400
    with pytest.raises(CapabilityUnavailable, match="no single provider"):
        eligible_providers("a", alias, frozenset({T, R}))


def test_weights_share_traffic_and_fallbacks_come_last() -> None:
    providers = [provider("a", 300), provider("b", 100), provider("fb", 0)]
    rng = random.Random(7)
    firsts = Counter(attempt_order(providers, rng)[0].name for _ in range(4000))
    assert firsts["fb"] == 0
    assert 0.70 < firsts["a"] / 4000 < 0.80
    for _ in range(50):
        order = [p.name for p in attempt_order(providers, rng)]
        assert sorted(order[:2]) == ["a", "b"] and order[2] == "fb"


def test_only_fallbacks_are_tried_in_order() -> None:
    order = attempt_order([provider("x", 0), provider("y", 0)], random.Random(1))
    assert [p.name for p in order] == ["x", "y"]


def test_health_orders_live_providers_first_and_keeps_the_rest_as_last_resort() -> None:
    providers = [
        provider("sick", 500),
        provider("a", 100),
        provider("b", 100),
        provider("fb-sick", 0),
        provider("fb", 0),
    ]
    for seed in range(20):
        order = [p.name for p in order_by_health(providers, {"a", "b", "fb"}, random.Random(seed))]
        assert sorted(order[:2]) == ["a", "b"]
        assert order[2:] == ["sick", "fb", "fb-sick"]
