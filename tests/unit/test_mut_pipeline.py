"""The router's verdicts (``pipeline.py``) without a server: the error a client gets when every
provider is at capacity, the refusal counted, and the failure a provider's health remembers.

Written for mutation testing (docs/testing.md): the e2e tests see these through HTTP with one
provider; here two providers, against ``httpx.MockTransport``.
"""

from __future__ import annotations

from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from tests.h1_mock import handler_connect
from tests.unit.test_mut_upstream import COMPLETION, chat, provider, shell
from trio_gateway.capacity.gate import LocalGate
from trio_gateway.capacity.gate_kinds import Gate
from trio_gateway.capacity.health import ProviderHealth
from trio_gateway.config.schema import AliasConfig
from trio_gateway.core.errors import AllProvidersFailed, GatewayError, Overloaded
from trio_gateway.core.events import Event, ResponseDone
from trio_gateway.dispatch.router import Router
from trio_gateway.ops.metrics import ReplicaGauges
from trio_gateway.providers.openai_compatible.replicas import (
    Replica,
    ReplicaSet,
    replica_config,
    replica_label,
)
from trio_gateway.providers.openai_compatible.signals import ReplicaSignals
from trio_gateway.providers.upstream import Upstream


async def refuse(request: httpx.Request) -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "broken"}})


def local(gate: Gate) -> LocalGate:
    assert isinstance(gate, LocalGate)
    return gate


def router_of(*upstreams: Upstream) -> Router:
    alias = AliasConfig(providers=tuple(u.config for u in upstreams))
    return Router({"a": alias}, {u.name: u for u in upstreams})


async def ignore(events: list[Event]) -> None:
    pass


async def test_every_provider_at_capacity_names_them_and_counts_one_refusal() -> None:
    first = shell(refuse, name="p1", max_inflight=1, queue_timeout_s=0.0)
    fallback = shell(refuse, name="p2", max_inflight=1, queue_timeout_s=0.0, weight=0)
    holder = object()
    for upstream in (first, fallback):
        upstream.gate.try_acquire_nowait(holder)
    router = router_of(first, fallback)
    with pytest.raises(Overloaded) as caught:
        await router.run(chat(), router.plan(chat()), ignore)
    assert caught.value.message == "every provider of 'a' is at capacity (p1, p2); retry shortly"
    sample = router.metrics.registry.get_sample_value(
        "gateway_refusals_total", {"alias": "a", "reason": "saturated"}
    )
    assert sample == 1.0


async def test_failures_are_remembered_by_each_provider_s_health() -> None:
    first = shell(refuse, name="p1")
    second = shell(refuse, name="p2", weight=0)
    router = router_of(first, second)
    with pytest.raises(AllProvidersFailed):
        await router.run(chat(), router.plan(chat()), ignore)
    for name in ("p1", "p2"):
        error = router.health[name].last_error
        assert error is not None and "broken" in error
    assert router.ready() == {"a": ["p1", "p2"]}


def queue_router(*upstreams: Upstream, wait_s: float = 1.0) -> Router:
    alias = AliasConfig(
        providers=tuple(u.config for u in upstreams), on_saturated="queue", max_queue_wait_s=wait_s
    )
    return Router({"a": alias}, {u.name: u for u in upstreams})


async def answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=COMPLETION)


async def test_the_queue_waits_for_a_weight_1_provider_not_for_a_fallback(
    autojump_clock: trio.abc.Clock,
) -> None:
    first = shell(answer, name="p1", max_inflight=1, weight=1)
    fallback = shell(answer, name="p2", max_inflight=1, weight=0)
    first.gate.try_acquire_nowait(object())
    router = queue_router(first, fallback)
    with pytest.raises(Overloaded) as caught:
        await router.run(chat(), router.plan(chat()), ignore)
    assert caught.value.message == "alias 'a': no slot within 1 s"


async def test_the_queue_of_weight_0_providers_only_takes_them(
    autojump_clock: trio.abc.Clock,
) -> None:
    router = queue_router(shell(answer, name="p1", weight=0))
    events: list[Event] = []

    async def keep(batch: list[Event]) -> None:
        events.extend(batch)

    await router.run(chat(), router.plan(chat()), keep)
    assert events[-1] == ResponseDone("stop")


async def test_a_photo_finish_gives_the_second_slot_back(autojump_clock: trio.abc.Clock) -> None:
    first = shell(answer, name="p1", max_inflight=1)
    second = shell(answer, name="p2", max_inflight=1)
    holder = object()
    for upstream in (first, second):
        upstream.gate.try_acquire_nowait(holder)
    router = queue_router(first, second, wait_s=10.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(router.run, chat(), router.plan(chat()), ignore)
        await trio.testing.wait_all_tasks_blocked()
        local(first.gate).release_nowait(holder)
        local(second.gate).release_nowait(holder)
    assert first.gate.statistics().in_flight == 0
    assert second.gate.statistics().in_flight == 0


async def test_gauges_report_each_provider_s_state_and_load() -> None:
    router = router_of(shell(refuse, name="p1"))
    health = router.health["p1"]
    assert isinstance(health, ProviderHealth)
    health.upstream_load = 3
    (gauge,) = router.gauges()
    assert (gauge.provider, gauge.state, gauge.upstream_load) == ("p1", "starting", 3)


async def test_retry_after_follows_how_long_requests_held_a_slot(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await trio.sleep(10.0)
        return httpx.Response(200, json=COMPLETION)

    upstream = shell(
        slow, name="p1", max_inflight=1, queue_timeout_s=0.0, first_token_timeout_s=100.0
    )
    router = router_of(upstream)
    await trio.sleep(100.0)  # the request starts at no special instant
    await router.run(chat(), router.plan(chat()), ignore)
    # The moving average moved from 2 s a fifth of the way to the 10 s the request took.
    upstream.gate.try_acquire_nowait(object())
    with pytest.raises(Overloaded) as caught:
        await router.run(chat(), router.plan(chat()), ignore)
    assert caught.value.retry_after_s == 4.0  # ceil(2 + 0.2 * (10 - 2))


async def test_each_endpoint_shows_its_gate_and_what_it_says_of_itself() -> None:
    upstream = shell(refuse, name="p1", max_inflight=3, base_url="http://10.0.0.5:8000/v1")
    upstream.gate.try_acquire_nowait(object())
    upstream.signals = ReplicaSignals(waiting=2, kv_cache_usage=0.5, load=4)
    upstream.prefix_cache.update(ReplicaSignals(prefix_cache_queries=100, prefix_cache_hits=0))
    upstream.prefix_cache.update(ReplicaSignals(prefix_cache_queries=300, prefix_cache_hits=150))
    router = router_of(upstream)
    (gauge,) = router.gauges()
    assert gauge.endpoints == (
        ReplicaGauges(
            replica="10.0.0.5:8000",
            in_flight=1,
            max_inflight=3,
            state="",
            upstream_load=4,
            waiting=2,
            kv_cache_usage=0.5,
            prefix_cache_queries=200,
            prefix_cache_hits=150,
            prefix_cache_hit_ratio=0.75,
        ),
    )


def fleet(
    routing: str = "round_robin", *names: str, handler: Any = answer, **overrides: Any
) -> ReplicaSet:
    urls = [f"http://{n}:8000/v1" for n in names]
    config = provider(
        name="fleet", endpoints=tuple(urls), base_url=None, routing=routing, **overrides
    )
    replicas = []
    for url in urls:
        own = replica_config(config, url)
        upstream = Upstream(
            own,
            None,
            httpx.AsyncClient(transport=httpx.MockTransport(handler)),
            connect=handler_connect(handler),
        )
        replicas.append(Replica(replica_label(url), upstream, ProviderHealth(own, now=0.0)))
    return ReplicaSet(config, replicas)


async def test_a_replicated_provider_shows_each_replica() -> None:
    replicas = fleet("round_robin", "a", "b")
    first, second = replicas.replicas
    first.upstream.gate.try_acquire_nowait(object())
    first.health.upstream_load = 5
    second.health.success()
    second.upstream.signals = ReplicaSignals(load=7)
    router = Router({"x": AliasConfig(providers=(replicas.config,))}, {"fleet": replicas})
    (gauge,) = router.gauges()
    assert (gauge.provider, gauge.in_flight, gauge.max_inflight, gauge.state) == (
        "fleet",
        1,
        6,
        "healthy",
    )
    assert [(e.replica, e.in_flight, e.state, e.upstream_load) for e in gauge.endpoints] == [
        ("a:8000", 1, "starting", 5),
        ("b:8000", 0, "healthy", 7),
    ]


async def test_the_alias_queue_waits_on_every_replica_in_the_session_s_order(
    autojump_clock: trio.abc.Clock,
) -> None:
    replicas = fleet("affinity", "a", "b", "c")
    alias = AliasConfig(providers=(replicas.config,), on_saturated="queue", max_queue_wait_s=5.0)
    router = Router({"x": alias}, {"fleet": replicas})
    holder = object()
    for replica in replicas.replicas:
        replica.upstream.gate.try_acquire_nowait(holder)
    request = attrs.evolve(chat(), alias="x", session_id="s1")
    home = replicas.candidates(request, trio.current_time())[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(router.run, request, router.plan(request), ignore)
        await trio.testing.wait_all_tasks_blocked()
        local(home.upstream.gate).release_nowait(holder)  # the one that frees first wins
    assert home.upstream.gate.statistics().in_flight == 0
    assert sum(r.upstream.gate.statistics().in_flight for r in replicas.replicas) == 2


async def test_a_spill_is_counted_where_it_left_and_each_failure_named(
    autojump_clock: trio.abc.Clock,
) -> None:
    first = shell(answer, name="p1", max_inflight=1, queue_timeout_s=0.0)
    second = shell(refuse, name="p2", weight=0)
    first.gate.try_acquire_nowait(object())
    router = router_of(first, second)
    with pytest.raises(AllProvidersFailed) as caught:
        await router.run(chat(), router.plan(chat()), ignore)
    assert caught.value.message.startswith(
        "all 2 providers failed: p1: [overloaded] p1: all 1 slots busy for 0 s; p2: "
    )
    assert router.recent.summary("p1", trio.current_time())["spills"] == 1
    assert router.recent.summary("p2", trio.current_time())["spills"] == 0


async def test_traffic_that_takes_a_provider_out_of_rotation_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = shell(refuse, name="p1", unhealthy_after=1, startup_grace_s=0.0)
    router = router_of(upstream)
    with pytest.raises(GatewayError):
        await router.run(chat(), router.plan(chat()), ignore)
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith("provider p1: starting -> unhealthy (p1")


async def test_a_replica_out_of_rotation_is_logged_by_its_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    replicas = fleet("round_robin", "a", handler=refuse, unhealthy_after=1, startup_grace_s=0.0)
    router = Router({"a": AliasConfig(providers=(replicas.config,))}, {"fleet": replicas})
    with pytest.raises(GatewayError):
        await router.run(chat(), router.plan(chat()), ignore)
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith("provider fleet@a:8000: starting -> unhealthy (fleet")
