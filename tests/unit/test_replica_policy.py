"""The routing policies (``replica_policy.py``): round robin, least loaded and affinity order the
healthy replicas; affinity's ring is the one docs/routing.md describes, moves only the keys of
a replica that comes or goes, and bounds the load of a hot key. Where the key comes from:
test_session_key.py."""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.replica_views import idle
from trio_gateway.capacity.replica_policy import (
    Affinity,
    LeastLoaded,
    Policy,
    ReplicaView,
    RoundRobin,
    load_score,
    make_policy,
)


def first_choices(policy: Policy, replicas: list[ReplicaView], keys: list[str]) -> list[str]:
    return [policy.order(replicas, key)[0] for key in keys]


KEYS = [f"p:{i:04x}" for i in range(200)]
NAMES = st.lists(
    st.text("abcdefghij-0123456789", min_size=1, max_size=8), min_size=2, max_size=8, unique=True
)

# --- every policy ----------------------------------------------------------------------------

REPLICAS = st.lists(
    st.builds(
        ReplicaView,
        name=st.text("abcdef", min_size=1, max_size=3),
        in_flight=st.integers(0, 40),
        capacity=st.integers(1, 32),
        healthy=st.booleans(),
        waiting=st.none() | st.integers(0, 10),
        kv_cache_usage=st.none() | st.floats(0, 1),
        upstream_load=st.none() | st.integers(0, 60),
    ),
    max_size=6,
    unique_by=lambda r: r.name,
)


@pytest.mark.parametrize("name", ["round_robin", "least_loaded", "affinity"])
@settings(max_examples=60)
@given(replicas=REPLICAS, key=st.text("ab\u00e9\u4e2d", max_size=5))
def test_order_lists_each_healthy_replica_once(
    name: str, replicas: list[ReplicaView], key: str
) -> None:
    policy = make_policy(name)
    order = policy.order(replicas, key)
    assert sorted(order) == sorted(r.name for r in replicas if r.healthy)


@pytest.mark.parametrize("name", ["round_robin", "least_loaded", "affinity"])
def test_no_healthy_replica_means_no_order(name: str) -> None:
    policy = make_policy(name)
    assert policy.order([], "k") == []
    sick = [ReplicaView("a", 0, 4, healthy=False), ReplicaView("b", 0, 4, healthy=False)]
    assert policy.order(sick, "k") == []


def test_make_policy_names_the_choices() -> None:
    assert isinstance(make_policy("round_robin"), RoundRobin)
    assert isinstance(make_policy("least_loaded"), LeastLoaded)
    affinity = make_policy("affinity", epsilon=0.5)
    assert isinstance(affinity, Affinity) and affinity.epsilon == 0.5
    with pytest.raises(ValueError, match=r"unknown replica policy 'hash'.*affinity.*round_robin"):
        make_policy("hash")


@pytest.mark.parametrize(
    ("epsilon", "nodes"), [(-0.1, 100), (math.nan, 100), (math.inf, 1), (0.2, 0)]
)
def test_affinity_rejects_meaningless_settings(epsilon: float, nodes: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        Affinity(epsilon=epsilon, virtual_nodes=nodes)


# --- round robin -----------------------------------------------------------------------------


@settings(max_examples=50)
@given(health=st.lists(st.booleans(), min_size=1, max_size=6), k=st.integers(1, 4))
def test_round_robin_each_healthy_replica_leads_k_times(health: list[bool], k: int) -> None:
    replicas = [ReplicaView(f"r{i}", 0, 4, healthy=h) for i, h in enumerate(health)]
    healthy = [r.name for r in replicas if r.healthy]
    policy = RoundRobin()
    orders = [policy.order(replicas, "k") for _ in range(k * len(healthy))]
    leads = Counter(order[0] for order in orders if order)
    assert leads == dict.fromkeys(healthy, k)
    for order in orders:
        # A rotation of the listed order, never an unhealthy name.
        start = healthy.index(order[0])
        assert order == healthy[start:] + healthy[:start]


# --- least loaded ----------------------------------------------------------------------------

R = ReplicaView


@pytest.mark.parametrize(
    ("replicas", "first"),
    [
        ([R("a", 3, 8), R("b", 1, 8)], "b"),
        # Fractions of capacity, not counts.
        ([R("a", 4, 16), R("b", 2, 4)], "a"),
        # Queued inside vLLM counts on top of in flight: 2 + 2 > 3.
        ([R("a", 2, 8, waiting=2), R("b", 3, 8)], "b"),
        ([R("a", 2, 8, waiting=0), R("b", 3, 8)], "a"),
        # Other clients' requests, seen by vLLM's /load, replace the gateway's own count.
        ([R("a", 1, 8, upstream_load=6), R("b", 3, 8)], "b"),
        # ... only when larger: a stale /load below the gateway's count changes nothing.
        ([R("a", 4, 8, upstream_load=0), R("b", 3, 8)], "b"),
        ([R("a", 2, 8, upstream_load=2), R("b", 3, 8)], "a"),
        # KV cache usage separates equal counts ...
        ([R("a", 2, 8, kv_cache_usage=0.9), R("b", 2, 8, kv_cache_usage=0.1)], "b"),
        ([R("a", 3, 8, kv_cache_usage=0.0), R("b", 2, 8, kv_cache_usage=0.95)], "b"),
        # ... but is worth at most one request.
        ([R("a", 2, 8, kv_cache_usage=0.0), R("b", 1, 8, kv_cache_usage=0.99)], "b"),
        # An out-of-range scrape is clamped to 1: 1 + 1 < 2 + .5.
        ([R("a", 2, 8, kv_cache_usage=0.5), R("b", 1, 8, kv_cache_usage=7.0)], "b"),
        ([R("a", 1, 8, kv_cache_usage=math.nan), R("b", 1, 8, kv_cache_usage=0.5)], "a"),
        # The least loaded but unhealthy replica is not a choice.
        ([R("a", 0, 8, healthy=False), R("b", 7, 8), R("c", 5, 8)], "c"),
        # Everything at once: a = (5 + 1 + .5) / 10 = .65, b = (3 + 2 + .25) / 8 = .656, c = .7
        (
            [
                R("c", 7, 10),
                R("a", 2, 10, waiting=1, kv_cache_usage=0.5, upstream_load=5),
                R("b", 3, 8, waiting=2, kv_cache_usage=0.25),
            ],
            "a",
        ),
    ],
)
def test_least_loaded_first_choice(replicas: list[ReplicaView], first: str) -> None:
    assert LeastLoaded().order(replicas, "k")[0] == first


def test_load_score_formula() -> None:
    assert load_score(R("a", 2, 8)) == 0.25
    assert load_score(R("a", 2, 8, waiting=2, kv_cache_usage=0.5, upstream_load=5)) == 7.5 / 8
    assert load_score(R("a", 6, 8, waiting=None, kv_cache_usage=None, upstream_load=5)) == 0.75


def test_least_loaded_orders_everyone_by_score() -> None:
    replicas = [R("a", 6, 8), R("b", 0, 8), R("c", 3, 8, waiting=4), R("d", 1, 2)]
    # a .75, b 0, c .875, d .5
    assert LeastLoaded().order(replicas, "k") == ["b", "d", "a", "c"]


def test_least_loaded_equal_replicas_share_the_lead() -> None:
    replicas = [R("a", 1, 8), R("b", 1, 8), R("c", 1, 8), R("busy", 5, 8)]
    policy = LeastLoaded()
    orders = [policy.order(replicas, "k") for _ in range(30)]
    assert Counter(order[0] for order in orders) == {"a": 10, "b": 10, "c": 10}
    assert all(order[-1] == "busy" for order in orders)


# --- affinity --------------------------------------------------------------------------------


def test_affinity_is_stable() -> None:
    replicas = [R("a", 1, 8), R("b", 2, 8), R("c", 0, 8)]
    for key in KEYS[:50]:
        orders = {tuple(Affinity().order(replicas, key)) for _ in range(3)}
        policy = Affinity()
        orders |= {tuple(policy.order(list(reversed(replicas)), key)) for _ in range(3)}
        assert len(orders) == 1


@settings(max_examples=30, deadline=None)
@given(names=NAMES, data=st.data())
def test_affinity_removing_a_replica_moves_only_its_keys(
    names: list[str], data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from(names))
    policy = Affinity()
    before = first_choices(policy, idle(*names), KEYS)
    after = first_choices(policy, idle(*(n for n in names if n != gone)), KEYS)
    for key, was, now in zip(KEYS, before, after, strict=True):
        assert now == was or was == gone, key
    assert gone not in after


@settings(max_examples=30, deadline=None)
@given(names=NAMES)
def test_affinity_adding_a_replica_moves_about_one_nth(names: list[str]) -> None:
    new = "+" + names[0]
    policy = Affinity()
    before = first_choices(policy, idle(*names), KEYS)
    after = first_choices(policy, idle(*names, new), KEYS)
    moved = [now for was, now in zip(before, after, strict=True) if now != was]
    assert set(moved) <= {new}
    # Expected 1/(n + 1); 2/n leaves room for an unlucky ring.
    assert len(moved) <= 2 * len(KEYS) / len(names)


def test_affinity_spreads_keys_evenly() -> None:
    rng = random.Random(4)
    keys = [f"p:{rng.getrandbits(64):016x}" for _ in range(10_000)]
    shares = Counter(first_choices(Affinity(virtual_nodes=100), idle("a", "b", "c", "d"), keys))
    assert set(shares) == {"a", "b", "c", "d"}
    assert all(0.15 <= count / len(keys) <= 0.35 for count in shares.values()), shares


@pytest.mark.parametrize(("epsilon", "seed"), [(0.25, 1), (0.25, 2), (0.1, 3), (0.0, 4), (1.0, 5)])
def test_affinity_bounds_the_load_of_a_hot_key(epsilon: float, seed: int) -> None:
    rng = random.Random(seed)
    names = ["a", "b", "c", "d", "e"]
    in_flight = dict.fromkeys(names, 0)
    policy = Affinity(epsilon=epsilon)
    for step in range(1, 1001):
        key = "u:hot" if rng.random() < 0.5 else f"u:{rng.randrange(100)}"
        chosen = policy.order([R(n, in_flight[n], 1000) for n in names], key)[0]
        in_flight[chosen] += 1
        mean = step / len(names)
        assert max(in_flight.values()) <= math.ceil((1 + epsilon) * mean) + 1, (step, in_flight)


def test_affinity_passes_over_a_full_replica_but_keeps_it_last() -> None:
    key = KEYS[0]
    names = ["a", "b", "c", "d"]
    ring_order = Affinity().order(idle(*names), key)
    home = ring_order[0]
    # 3 in flight in all, n = 4: bound = ceil(1.25 * 4 / 4) = 2.
    replicas = [R(n, 2 if n == home else 1 if n == ring_order[1] else 0, 8) for n in names]
    assert Affinity().order(replicas, key) == [*ring_order[1:], home]
    # Two full ones: 6 in flight, bound = ceil(1.25 * 7 / 4) = 3; both go last, in ring order.
    replicas = [R(n, 3 if n in ring_order[:2] else 0, 8) for n in names]
    assert Affinity().order(replicas, key) == ring_order[2:] + ring_order[:2]
    # All at 1: bound = ceil(1.25 * 5 / 4) = 2, nobody full; home again.
    assert Affinity().order([R(n, 1, 8) for n in names], key) == ring_order


def test_affinity_at_equal_loads_the_ring_decides() -> None:
    # Even at epsilon 0 (bound = ceil((total + 1) / n)) equal replicas are never full: some
    # replica is always below the bound, so the first choice never has to be a full one.
    policy = Affinity(epsilon=0.0)
    for key in KEYS[:20]:
        ring_order = policy.order(idle("a", "b", "c"), key)
        assert policy.order([R(n, 3, 8) for n in "abc"], key) == ring_order


@pytest.mark.parametrize(
    ("epsilon", "total", "n", "bound"),
    [
        (0.25, 0, 4, 1),
        (0.25, 3, 4, 2),
        (0.25, 7, 4, 3),
        (0.1, 9, 11, 1),
        (0.0, 5, 3, 2),
        (1.0, 9, 2, 10),
    ],
)
def test_affinity_bound_is_exact(epsilon: float, total: int, n: int, bound: int) -> None:
    assert Affinity(epsilon=epsilon).bound(total, n) == bound


def test_an_unhealthy_replicas_keys_go_to_the_next_and_come_back() -> None:
    names = ["a", "b", "c", "d"]
    policy = Affinity()
    ring_orders = {key: policy.order(idle(*names), key) for key in KEYS}
    on_b = [key for key, order in ring_orders.items() if order[0] == "b"]
    assert on_b
    sick = [R(n, 0, 8, healthy=n != "b") for n in names]
    for key, order in ring_orders.items():
        assert policy.order(sick, key) == [n for n in order if n != "b"]
    assert {key: policy.order(idle(*names), key) for key in KEYS} == ring_orders


def test_affinity_keeps_a_few_rings_and_stays_right_after_forgetting() -> None:
    policy = Affinity()
    sets = [idle(*(f"r{j}" for j in range(i, i + 3))) for i in range(10)]
    first = [policy.order(s, "k") for s in sets]
    assert len(policy._rings) <= 4
    assert [Affinity().order(s, "k") for s in sets] == first
    assert [policy.order(s, "k") for s in sets] == first


# --- the ring, as docs/routing.md describes it -----------------------------------------------


def documented_ring_order(names: list[str], key: str, virtual_nodes: int) -> list[str]:
    """Each name owns the points blake2b-64 of "name#i" (big-endian); a key walks clockwise from
    its own point, and the names come in the order met."""

    def point(text: str) -> int:
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")

    ring = sorted((point(f"{name}#{i}"), name) for name in names for i in range(virtual_nodes))
    start = bisect.bisect_left(ring, (point(key), ""))
    return list(dict.fromkeys(name for _, name in ring[start:] + ring[:start]))


@pytest.mark.parametrize("virtual_nodes", [None, 1, 3])
def test_affinity_walks_the_documented_ring(virtual_nodes: int | None) -> None:
    # None: the default, 100 points a replica.
    policy = Affinity() if virtual_nodes is None else Affinity(virtual_nodes=virtual_nodes)
    names = ["a", "b", "c", "d"]
    for key in KEYS[:40]:
        expected = documented_ring_order(names, key, virtual_nodes or 100)
        assert policy.order(idle(*names), key) == expected, key


def test_affinity_removing_a_replica_keeps_everyones_order() -> None:
    # The order is where a session goes next: when its replica is removed from the config, it
    # lands on its second choice, and the rest of the order stays.
    names = ["a", "b", "c", "d", "e"]
    policy = Affinity(virtual_nodes=5)
    for key in KEYS[:40]:
        order = policy.order(idle(*names), key)
        for gone in names:
            rest = [n for n in names if n != gone]
            assert policy.order(idle(*rest), key) == [n for n in order if n != gone], key


# --- defaults, messages, rotations -----------------------------------------------------------


def test_make_policy_affinity_defaults_to_the_documented_epsilon() -> None:
    policy = make_policy("affinity")
    assert isinstance(policy, Affinity) and policy.epsilon == 0.25


def test_make_policy_names_the_choices_in_its_message() -> None:
    with pytest.raises(ValueError) as info:
        make_policy("hash")
    assert str(info.value) == (
        "unknown replica policy 'hash'; choose one of affinity, least_loaded, round_robin"
    )


def test_a_replica_of_capacity_one_is_full_at_one_request() -> None:
    assert load_score(R("a", 1, 1)) == 1.0
    assert load_score(R("a", 0, 1, waiting=1, kv_cache_usage=0.5)) == 1.5
    # 1 of 1 against 3 of 4.
    assert LeastLoaded().order([R("a", 1, 1), R("b", 3, 4)], "k") == ["b", "a"]


def test_round_robin_starts_in_the_listed_order_and_moves_one_further() -> None:
    replicas = [R("a", 0, 4), R("b", 0, 4, healthy=False), R("c", 0, 4), R("d", 0, 4)]
    policy = RoundRobin()
    assert [policy.order(replicas, "k") for _ in range(4)] == [
        ["a", "c", "d"],
        ["c", "d", "a"],
        ["d", "a", "c"],
        ["a", "c", "d"],
    ]


def test_least_loaded_ties_start_in_the_listed_order_and_move_one_further() -> None:
    # Two runs of equal scores: c, a, b at 1/8 (listed in that order), x, y at 3/8.
    replicas = [
        R("x", 3, 8),
        R("c", 1, 8),
        R("busy", 5, 8),
        R("a", 1, 8),
        R("y", 3, 8),
        R("b", 1, 8),
    ]
    policy = LeastLoaded()
    assert [policy.order(replicas, "k") for _ in range(4)] == [
        ["c", "a", "b", "x", "y", "busy"],
        ["a", "b", "c", "y", "x", "busy"],
        ["b", "c", "a", "x", "y", "busy"],
        ["c", "a", "b", "y", "x", "busy"],
    ]
