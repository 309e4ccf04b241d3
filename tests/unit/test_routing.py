from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_gateway.config.schema import AliasConfig, ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import CapabilityUnavailable, ModelNotFound
from trio_gateway.dispatch.routing import (
    attempt_order,
    eligible_providers,
    order_by_health,
    resolve_alias,
)

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


def _order_as_it_was(
    eligible: list[ProviderConfig], in_rotation: set[str], rng: random.Random
) -> list[ProviderConfig]:
    """order_by_health and attempt_order before the one-pass partition and the one-provider
    shortcut: the reference the shortcuts must equal, draws from the generator included."""

    def weighted(providers: list[ProviderConfig]) -> list[ProviderConfig]:
        pool = [p for p in providers if p.weight > 0]
        order: list[ProviderConfig] = []
        while pool:
            pick = rng.uniform(0, sum(p.weight for p in pool))
            acc = 0.0
            for i, p in enumerate(pool):
                acc += p.weight
                if pick <= acc:
                    order.append(pool.pop(i))
                    break
            else:
                order.append(pool.pop())
        return order + [p for p in providers if p.weight == 0]

    live = [p for p in eligible if p.name in in_rotation]
    resting = [p for p in eligible if p.name not in in_rotation]
    order = weighted([p for p in live if p.weight > 0])
    order += sorted((p for p in resting if p.weight > 0), key=lambda p: -p.weight)
    return order + [p for p in live if p.weight == 0] + [p for p in resting if p.weight == 0]


@given(
    weights=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=5),
    live=st.sets(st.integers(min_value=0, max_value=4)),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_the_order_and_the_draws_are_what_they_were(
    weights: list[int], live: set[int], seed: int
) -> None:
    providers = [provider(f"p{i}", w) for i, w in enumerate(weights)]
    names = {f"p{i}" for i in live}
    ours, theirs = random.Random(seed), random.Random(seed)
    for _ in range(3):  # the generator's state after each call counts as much as the order
        assert order_by_health(providers, names, ours) == _order_as_it_was(providers, names, theirs)
    assert ours.random() == theirs.random()
