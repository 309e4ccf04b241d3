"""The router's verdicts (``pipeline.py``) without a server: the error a client gets when every
provider is at capacity, the refusal counted, and the failure a provider's health remembers.

Written for mutation testing (docs/testing.md): the e2e tests see these through HTTP with one
provider; here two providers, against ``httpx.MockTransport``.
"""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from tests.unit.test_mut_upstream import COMPLETION, chat, shell
from trio_gateway.config import AliasConfig
from trio_gateway.errors import AllProvidersFailed, Overloaded
from trio_gateway.events import Event, ResponseDone
from trio_gateway.health import ProviderHealth
from trio_gateway.pipeline import Router
from trio_gateway.providers.upstream import Upstream


async def refuse(request: httpx.Request) -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "broken"}})


def router_of(*upstreams: Upstream) -> Router:
    alias = AliasConfig(providers=tuple(u.config for u in upstreams))
    return Router({"a": alias}, {u.name: u for u in upstreams})


async def ignore(event: Event) -> None:
    pass


async def test_every_provider_at_capacity_names_them_and_counts_one_refusal() -> None:
    first = shell(refuse, name="p1", max_inflight=1, queue_timeout_s=0.0)
    fallback = shell(refuse, name="p2", max_inflight=1, queue_timeout_s=0.0, weight=0)
    holder = object()
    for upstream in (first, fallback):
        upstream.gate.acquire_on_behalf_of_nowait(holder)
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
    first.gate.acquire_on_behalf_of_nowait(object())
    router = queue_router(first, fallback)
    with pytest.raises(Overloaded) as caught:
        await router.run(chat(), router.plan(chat()), ignore)
    assert caught.value.message == "alias 'a': no slot within 1 s"


async def test_the_queue_of_weight_0_providers_only_takes_them(
    autojump_clock: trio.abc.Clock,
) -> None:
    router = queue_router(shell(answer, name="p1", weight=0))
    events: list[Event] = []

    async def keep(event: Event) -> None:
        events.append(event)

    await router.run(chat(), router.plan(chat()), keep)
    assert events[-1] == ResponseDone("stop")


async def test_a_photo_finish_gives_the_second_slot_back(autojump_clock: trio.abc.Clock) -> None:
    first = shell(answer, name="p1", max_inflight=1)
    second = shell(answer, name="p2", max_inflight=1)
    holder = object()
    for upstream in (first, second):
        upstream.gate.acquire_on_behalf_of_nowait(holder)
    router = queue_router(first, second, wait_s=10.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(router.run, chat(), router.plan(chat()), ignore)
        await trio.testing.wait_all_tasks_blocked()
        first.gate.release_on_behalf_of(holder)
        second.gate.release_on_behalf_of(holder)
    assert first.gate.borrowed_tokens == 0
    assert second.gate.borrowed_tokens == 0


async def test_gauges_report_each_provider_s_state_and_load() -> None:
    router = router_of(shell(refuse, name="p1"))
    health = router.health["p1"]
    assert isinstance(health, ProviderHealth)
    health.upstream_load = 3
    (gauge,) = router.gauges()
    assert (gauge.provider, gauge.state, gauge.upstream_load) == ("p1", "starting", 3)
