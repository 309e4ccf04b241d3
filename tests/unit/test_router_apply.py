"""``Router.apply``: a reload's aliases and providers swapped in at once (reloader.py), with the
state that must carry over (alias queue counts, service times, health, the status minutes) and
a request planned before the swap finishing on what its plan holds."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from tests.unit.test_mut_pipeline import answer, ignore, local, queue_router
from tests.unit.test_mut_upstream import Handler, chat, shell
from trio_gateway.capacity.health import ProviderHealth, State
from trio_gateway.config.schema import AliasConfig
from trio_gateway.core.errors import Overloaded
from trio_gateway.dispatch.router import INITIAL_SERVICE_TIME_S, Router


def alias_of(*names: str, queue: bool = False) -> AliasConfig:
    providers = tuple(shell(answer, name=n).config for n in names)
    return AliasConfig(providers=providers, on_saturated="queue" if queue else "spill")


async def test_apply_swaps_aliases_providers_and_health_at_once() -> None:
    p1, p2 = shell(answer, name="p1"), shell(answer, name="p2")
    router = Router({"a": alias_of("p1")}, {"p1": p1})
    kept = router.health["p1"]
    assert isinstance(kept, ProviderHealth)
    given = ProviderHealth(p2.config, now=trio.current_time())
    router.apply({"b": alias_of("p1", "p2")}, {"p1": p1, "p2": p2}, {"p1": kept, "p2": given})
    assert list(router.aliases) == ["b"]
    assert router.upstreams == {"p1": p1, "p2": p2}
    assert router.health["p1"] is kept and router.health["p2"] is given
    assert router.ready() == {"b": ["p1", "p2"]}
    # A provider the caller gives no health for gets a new one, not another provider's.
    router.apply({"b": alias_of("p1", "p2")}, {"p1": p1, "p2": p2}, {})
    assert router.health["p2"] is not given and router.health["p1"] is not kept
    assert router.health["p2"].state is State.STARTING


async def test_service_times_carry_over_and_start_fresh_for_new_providers(
    autojump_clock: trio.abc.Clock,
) -> None:
    p1, p2 = shell(answer, name="p1"), shell(answer, name="p2")
    router = Router({"a": alias_of("p1")}, {"p1": p1})
    router._served(p1, 7.0)
    learned = router._service_time_s["p1"]
    assert learned != INITIAL_SERVICE_TIME_S
    router.apply({"a": alias_of("p1", "p2")}, {"p1": p1, "p2": p2}, {})
    assert router._service_time_s == {"p1": learned, "p2": INITIAL_SERVICE_TIME_S}
    # A retired provider's last attempt ending after the swap is not an error, nor recorded.
    router.apply({"a": alias_of("p2")}, {"p2": p2}, {})
    router._served(p1, 1.0)
    assert router._service_time_s == {"p2": INITIAL_SERVICE_TIME_S}
    assert router._retry_after_s(p1, 0) == 1.0


async def test_the_status_minutes_of_a_provider_that_stays_are_kept() -> None:
    p1, p2 = shell(answer, name="p1"), shell(answer, name="p2")
    router = Router({"a": alias_of("p1")}, {"p1": p1})
    now = trio.current_time()
    router.recent.request("p1", now, error=True, ttft_s=0.5)
    before = router.recent
    router.apply({"a": alias_of("p1", "p2")}, {"p1": p1, "p2": p2}, {})
    assert router.recent is not before
    assert router.recent._rings["p1"] is before._rings["p1"]
    assert set(router.recent._rings) == {"p1", "p2"}
    router.recent.request("p2", now, error=False, ttft_s=None)
    assert sum(b.requests for b in router.recent._rings["p2"]) == 1


async def test_a_queued_request_of_a_removed_alias_keeps_its_count_until_it_leaves(
    autojump_clock: trio.abc.Clock,
) -> None:
    p1 = shell(answer, name="p1", max_inflight=1)
    router = queue_router(p1, wait_s=10.0)
    holder = object()
    assert p1.gate.try_acquire_nowait(holder)
    queued = trio.Event()
    async with trio.open_nursery() as nursery:

        async def waiting() -> None:
            queued.set()
            with pytest.raises(Overloaded):
                await router.run(chat(), router.plan(chat()), ignore)

        nursery.start_soon(waiting)
        await queued.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert router._queued == {"a": 1}
        router.apply({"b": alias_of("p1", queue=True)}, {"p1": p1}, {})
        # The removed alias keeps its one waiter's count.
        assert router._queued == {"a": 1}
    # Refused after its wait (10 s): the count goes, and the removed alias with it.
    assert router._queued == {}
    local(p1.gate).release_nowait(holder)


async def test_queue_counts_come_and_go_with_their_waiters(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Two waiters of one alias (max_queued 2): counted 1, 2; a third is refused at once with
    a Retry-After for the two ahead; both leave, and nothing is left behind."""
    p1 = shell(answer, name="p1", max_inflight=1)
    alias = AliasConfig(
        providers=(p1.config,), on_saturated="queue", max_queue_wait_s=10.0, max_queued=2
    )
    router = Router({"a": alias}, {"p1": p1})
    holder = object()
    assert p1.gate.try_acquire_nowait(holder)
    refused: list[Overloaded] = []
    async with trio.open_nursery() as nursery:

        async def waiting() -> None:
            with pytest.raises(Overloaded) as caught:
                await router.run(chat(), router.plan(chat()), ignore)
            refused.append(caught.value)

        for expected in (1, 2):
            nursery.start_soon(waiting)
            await trio.testing.wait_all_tasks_blocked()
            assert router._queued == {"a": expected}
        with pytest.raises(Overloaded) as full:
            await router.run(chat(), router.plan(chat()), ignore)
        assert full.value.message == "alias 'a': queue full (2 waiting)"
        # (2 ahead + 1) x the initial 2 s per request over 1 slot.
        assert full.value.retry_after_s == 3 * INITIAL_SERVICE_TIME_S
    assert [e.message for e in refused] == ["alias 'a': no slot within 10 s"] * 2
    # The last one out of the queue saw none left behind it.
    assert refused[-1].retry_after_s == INITIAL_SERVICE_TIME_S
    assert router._queued == {}
    local(p1.gate).release_nowait(holder)


async def test_attempts_running_on_an_upstream_are_counted() -> None:
    """What tells a provider retired by a reload that its last stream has ended (live.py)."""
    p1 = shell(answer, name="p1")
    proceed = trio.Event()
    during: list[int] = []

    async def slow(event: object) -> None:
        during.append(p1.active)
        await proceed.wait()

    router = Router({"a": alias_of("p1")}, {"p1": p1})
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(router.run, chat(), router.plan(chat()), slow)
        await trio.testing.wait_all_tasks_blocked()
        assert p1.active == 2
        proceed.set()
    assert p1.active == 0
    assert during[0] in (1, 2)


async def test_a_request_planned_before_a_swap_runs_on_its_plan() -> None:
    calls: list[str] = []

    def recorder(name: str) -> Handler:
        async def handler(request: httpx.Request) -> httpx.Response:
            calls.append(name)
            return await answer(request)

        return handler

    old, new = shell(recorder("old"), name="p"), shell(recorder("new"), name="p")
    router = Router({"a": alias_of("p")}, {"p": old})
    plan = router.plan(chat())
    old_health = router.health["p"]
    router.apply({"a": alias_of("p")}, {"p": new}, {})
    await router.run(chat(), plan, ignore)
    await router.run(chat(), router.plan(chat()), ignore)
    assert calls == ["old", "new"]
    # Each success fed the health of the provider it ran on.
    now = trio.current_time()
    assert old_health is not router.health["p"]
    assert old_health.snapshot(now).consecutive_successes == 1
    assert router.health["p"].snapshot(now).consecutive_successes == 1
