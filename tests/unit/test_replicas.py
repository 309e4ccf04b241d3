"""A replicated provider's runtime: its health as the alias sees it, its capacity, and the order
its replicas are tried in (the routing policy, then the replicas out of rotation)."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from tests.unit.test_mut_upstream import chat, provider, shell
from trio_gateway.capacity.health import ProviderHealth, State
from trio_gateway.capacity.replica_policy import Affinity
from trio_gateway.providers.openai_compatible.replicas import (
    GroupHealth,
    Replica,
    ReplicaSet,
    replica_config,
    replica_label,
)
from trio_gateway.providers.openai_compatible.signals import ReplicaSignals


async def unused(request: httpx.Request) -> httpx.Response:
    raise AssertionError("nothing is sent")


def fleet(routing: str, n: int = 3, max_inflight: int = 2) -> ReplicaSet:
    urls = [f"http://r{i}:8000/v1" for i in range(n)]
    config = provider(
        name="fleet",
        endpoints=tuple(urls),
        base_url=None,
        routing=routing,
        max_inflight=max_inflight,
    )
    replicas = []
    for url in urls:
        own = replica_config(config, url)
        upstream = shell(
            unused,
            **{
                "base_url": url,
                "endpoints": (),
                "name": "fleet",
                "routing": routing,
                "max_inflight": max_inflight,
            },
        )
        assert upstream.config.endpoint == own.endpoint
        replicas.append(Replica(replica_label(url), upstream, ProviderHealth(own, now=0.0)))
    return ReplicaSet(config, replicas)


def test_labels_and_configs() -> None:
    assert replica_label("http://10.0.0.5:8000/v1") == "10.0.0.5:8000"
    own = replica_config(
        provider(endpoints=("http://a/v1", "http://b/v1"), base_url=None), "http://b/v1"
    )
    assert (own.base_url, own.endpoints) == ("http://b/v1", ())


async def test_capacity_is_the_sum_of_the_replicas() -> None:
    replicas = fleet("round_robin", n=3, max_inflight=2)
    assert replicas.statistics().max_inflight == 6
    holder = object()
    replicas.replicas[1].upstream.gate.try_acquire_nowait(holder)
    stats = replicas.statistics()
    assert (stats.in_flight, stats.waiting) == (1, 0)


def health(*states: State) -> GroupHealth:
    members = []
    for state in states:
        member = ProviderHealth(provider(unhealthy_after=1, startup_grace_s=0), now=0.0)
        if state is State.HEALTHY:
            member.success()
        elif state is State.UNHEALTHY:
            member.failure("down", now=1.0)
        elif state is State.UNREACHABLE:  # never answered, failing within its grace
            member = ProviderHealth(provider(unhealthy_after=1, startup_grace_s=60), now=0.0)
            member.failure("down", now=1.0)
        members.append(member)
    return GroupHealth(members)


@pytest.mark.parametrize(
    ("states", "state", "in_rotation"),
    [
        ((State.HEALTHY, State.UNHEALTHY), State.HEALTHY, True),
        ((State.STARTING, State.UNHEALTHY), State.STARTING, True),
        ((State.UNHEALTHY, State.UNHEALTHY), State.UNHEALTHY, False),
        ((State.STARTING, State.HEALTHY), State.HEALTHY, True),
        ((State.UNREACHABLE, State.UNHEALTHY), State.UNREACHABLE, True),
        ((State.UNREACHABLE, State.STARTING), State.STARTING, True),
        ((State.UNREACHABLE, State.HEALTHY), State.HEALTHY, True),
    ],
)
def test_the_provider_is_in_rotation_while_any_replica_is(
    states: tuple[State, ...], state: State, in_rotation: bool
) -> None:
    group = health(*states)
    assert group.state is state
    assert group.in_rotation(2.0) is in_rotation
    snapshot = group.snapshot(2.0)
    assert snapshot.state is state
    failing = {State.UNHEALTHY, State.UNREACHABLE}
    assert (snapshot.last_error == "down") is bool(failing & set(states))


def test_cooling_down_only_when_every_replica_is() -> None:
    group = health(State.HEALTHY, State.HEALTHY)
    members = group._members
    members[0].cool_down(10.0)
    assert not group.cooling_down(5.0) and group.in_rotation(5.0)
    members[1].cool_down(8.0)
    assert group.cooling_down(5.0) and not group.in_rotation(5.0)
    assert not group.cooling_down(10.0)


def test_loads_add_up_when_known() -> None:
    group = health(State.HEALTHY, State.HEALTHY)
    assert group.upstream_load is None
    group._members[0].upstream_load = 3
    group._members[1].upstream_load = 4
    assert group.upstream_load == 7


async def test_replicas_out_of_rotation_come_last(autojump_clock: trio.abc.Clock) -> None:
    replicas = fleet("round_robin", n=3)
    down = replicas.replicas[0]
    down.health._unhealthy_after = 1
    down.health._grace_ends = 0.0
    down.health.failure("down", now=trio.current_time())
    for _ in range(4):
        order = [r.name for r in replicas.candidates(chat(), trio.current_time())]
        assert order[-1] == "r0:8000" and sorted(order[:2]) == ["r1:8000", "r2:8000"]


async def test_least_loaded_reads_gates_and_scraped_signals(
    autojump_clock: trio.abc.Clock,
) -> None:
    replicas = fleet("least_loaded", n=3, max_inflight=4)
    first, second, third = replicas.replicas
    first.upstream.gate.try_acquire_nowait(object())
    second.upstream.signals = ReplicaSignals(waiting=3)
    order = [r.name for r in replicas.candidates(chat(), trio.current_time())]
    assert order == ["r2:8000", "r0:8000", "r1:8000"]
    third.upstream.signals = ReplicaSignals(load=9)  # busy with other clients' requests
    order = [r.name for r in replicas.candidates(chat(), trio.current_time())]
    assert order[0] == "r0:8000" and order[-1] == "r2:8000"


async def test_affinity_follows_the_session_header(autojump_clock: trio.abc.Clock) -> None:
    import attrs

    replicas = fleet("affinity", n=4)
    now = trio.current_time()
    homes = {
        session: replicas.candidates(attrs.evolve(chat(), session_id=session), now)[0].name
        for session in (f"s{i}" for i in range(40))
    }
    again = {
        session: replicas.candidates(attrs.evolve(chat(), session_id=session), now)[0].name
        for session in homes
    }
    assert homes == again
    assert len(set(homes.values())) >= 3


async def test_a_scraped_load_counts_only_other_clients_on_top_of_the_gateway_s_own(
    autojump_clock: trio.abc.Clock,
) -> None:
    replicas = fleet("least_loaded", n=2, max_inflight=4)
    first, second = replicas.replicas
    # Scraped while the gateway had 10 requests there; they have all ended since.
    first.upstream.signals = ReplicaSignals(load=10, load_own=10)
    # Scraped with 1 of the gateway's and 2 of other clients'; the gateway has 3 there now.
    for _ in range(3):
        second.upstream.gate.try_acquire_nowait(object())
    second.upstream.signals = ReplicaSignals(load=3, load_own=1)
    views = {v.name: v for v in (r.view(trio.current_time()) for r in replicas.replicas)}
    assert views["r0:8000"].upstream_load == 0
    assert views["r1:8000"].upstream_load == 5
    # So the idle replica is first, not starved by its own past.
    assert replicas.candidates(chat(), trio.current_time())[0] is first


def test_a_replica_s_view_carries_its_scraped_signals() -> None:
    replicas = fleet("least_loaded", n=1, max_inflight=4)
    [only] = replicas.replicas
    only.upstream.signals = ReplicaSignals(waiting=2, kv_cache_usage=0.5, load=3, load_own=0)
    view = only.view(0.0)
    assert (view.waiting, view.kv_cache_usage, view.upstream_load) == (2, 0.5, 3)
    assert (view.in_flight, view.capacity) == (0, 4)


def test_the_group_snapshot_carries_the_summed_load() -> None:
    group = health(State.HEALTHY, State.HEALTHY)
    group._members[0].upstream_load = 3
    group._members[1].upstream_load = 4
    snapshot = group.snapshot(0.0)
    assert (snapshot.state, snapshot.upstream_load) == (State.HEALTHY, 7)


def test_affinity_takes_the_configured_epsilon() -> None:
    import attrs

    replicas = fleet("affinity", n=2)
    config = attrs.evolve(replicas.config, affinity_epsilon=0.75)
    policy = ReplicaSet(config, replicas.replicas).policy
    assert isinstance(policy, Affinity) and policy.epsilon == 0.75
