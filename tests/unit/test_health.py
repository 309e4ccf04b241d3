"""The health state machine, and the probe service on a virtual clock."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing

from trio_gateway.capacity.health import ProviderHealth, State, probe_service
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import UpstreamUnreachable


def config(**fields: object) -> ProviderConfig:
    base: dict[str, object] = {
        "name": "p",
        "type": "openai_compatible",
        "base_url": "http://x/v1",
        "model": "m",
        "unhealthy_after": 3,
        "healthy_after": 2,
        "startup_grace_s": 100.0,
        "probe_interval_s": 10.0,
        "probe_timeout_s": 5.0,
    }
    base.update(fields)
    return ProviderConfig(**base)  # type: ignore[arg-type]


def state_of(health: ProviderHealth) -> State:
    """Read through a call: mypy narrows ``health.state`` and forgets that calls change it."""
    return health.state


def test_a_provider_failing_inside_the_grace_is_unreachable_and_still_in_rotation() -> None:
    """A loading vLLM and a typo'd base_url both refuse connections: in rotation for the
    grace, but no longer shown as merely starting."""
    health = ProviderHealth(config(), now=0.0)
    assert state_of(health) is State.STARTING
    for t in range(10):
        health.failure("connection refused", now=float(t))
    assert state_of(health) is State.UNREACHABLE
    assert health.in_rotation(now=10.0)
    assert health.snapshot(10.0).last_error == "connection refused"
    assert health.grace_left(10.0) == 90.0


def test_first_answer_makes_it_healthy() -> None:
    health = ProviderHealth(config(), now=0.0)
    health.failure("x", now=1.0)
    assert state_of(health) is State.UNREACHABLE
    health.success()
    assert state_of(health) is State.HEALTHY
    assert health.last_error is None


def test_never_answering_after_the_grace_is_unhealthy() -> None:
    health = ProviderHealth(config(), now=0.0)
    health.failure("x", now=101.0)
    health.failure("x", now=102.0)
    assert state_of(health) is State.UNREACHABLE
    assert health.grace_left(102.0) == 0.0
    health.failure("x", now=103.0)
    assert state_of(health) is State.UNHEALTHY
    assert not health.in_rotation(now=103.0)


def test_unhealthy_after_consecutive_failures_and_back_after_successes() -> None:
    health = ProviderHealth(config(), now=0.0)
    health.success()
    health.failure("a", now=1.0)
    health.failure("b", now=2.0)
    health.success()  # breaks the run
    health.failure("c", now=3.0)
    health.failure("d", now=4.0)
    assert state_of(health) is State.HEALTHY
    health.failure("e", now=5.0)
    assert state_of(health) is State.UNHEALTHY
    assert health.snapshot(5.0).last_error == "e"
    health.success()
    assert state_of(health) is State.UNHEALTHY
    health.success()
    assert state_of(health) is State.HEALTHY


def test_cool_down_takes_a_provider_out_of_rotation_until_it_passes() -> None:
    health = ProviderHealth(config(), now=0.0)
    health.success()
    health.cool_down(until=30.0)
    assert not health.in_rotation(now=29.9)
    assert health.in_rotation(now=30.0)
    assert state_of(health) is State.HEALTHY  # busy is not broken


async def test_probe_service_marks_a_dead_provider_unhealthy_in_interval_times_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = config(startup_grace_s=0.0)
    health = ProviderHealth(cfg, now=trio.current_time())
    alive = True
    calls: list[float] = []

    async def probe() -> None:
        calls.append(trio.current_time())
        if not alive:
            raise UpstreamUnreachable("p: cannot connect (refused)", provider="p")

    async with trio.open_nursery() as nursery:
        await nursery.start(probe_service, "p", cfg, health, probe)
        await trio.sleep(1)
        assert state_of(health) is State.HEALTHY
        alive = False
        went_down = trio.current_time()
        await health.changed.wait()
        assert state_of(health) is State.UNHEALTHY
        # Within probe_interval_s times unhealthy_after of the failure starting.
        assert trio.current_time() - went_down <= cfg.probe_interval_s * cfg.unhealthy_after
        alive = True
        await health.changed.wait()
        assert state_of(health) is State.HEALTHY
        nursery.cancel_scope.cancel()
    intervals = {round(b - a, 6) for a, b in itertools.pairwise(calls)}
    assert intervals == {10.0}


async def test_a_hanging_probe_counts_as_a_failure(autojump_clock: trio.testing.MockClock) -> None:
    cfg = config(startup_grace_s=0.0, unhealthy_after=1)
    health = ProviderHealth(cfg, now=trio.current_time())

    async def probe() -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(probe_service, "p", cfg, health, probe)
        await health.changed.wait()
        assert state_of(health) is State.UNHEALTHY
        assert trio.current_time() == cfg.probe_timeout_s
        assert "timed out" in (health.last_error or "")
        nursery.cancel_scope.cancel()


async def test_a_bug_in_the_probe_is_logged_with_its_traceback_and_blames_no_provider(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(startup_grace_s=0.0, unhealthy_after=1)
    health = ProviderHealth(cfg, now=trio.current_time())
    health.success()
    calls = 0

    async def probe() -> None:
        nonlocal calls
        calls += 1
        raise KeyError("a gateway bug")

    async with trio.open_nursery() as nursery:
        await nursery.start(probe_service, "p", cfg, health, probe)
        await trio.sleep(cfg.probe_interval_s * 3 + 1)
        nursery.cancel_scope.cancel()
    assert calls == 4
    assert state_of(health) is State.HEALTHY
    assert health.snapshot(trio.current_time()).consecutive_failures == 0
    bugs = [r for r in caplog.records if "gateway bug" in r.getMessage()]
    assert len(bugs) == 4
    assert all(r.exc_info is not None and isinstance(r.exc_info[1], KeyError) for r in bugs)
