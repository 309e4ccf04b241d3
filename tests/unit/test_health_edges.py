"""Provider health at its edges: the grace period's last instant, the snapshot's fields, the
load a probe reads, and what a transition writes to the log."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from trio_gateway.capacity.health import (
    HealthSnapshot,
    ProviderHealth,
    State,
    log_transition,
    probe_service,
)
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import UnsupportedParameter, UpstreamUnreachable


def config(**fields: object) -> ProviderConfig:
    base: dict[str, object] = {
        "name": "p",
        "type": "openai_compatible",
        "base_url": "http://x/v1",
        "model": "m",
        "unhealthy_after": 1,
        "healthy_after": 1,
        "startup_grace_s": 10.0,
        "probe_interval_s": 10.0,
        "probe_timeout_s": 5.0,
    }
    base.update(fields)
    return ProviderConfig(**base)  # type: ignore[arg-type]


def test_the_grace_period_ends_at_its_last_instant() -> None:
    health = ProviderHealth(config(), now=0.0)
    health.failure("refused", now=9.999)
    assert health.state is State.UNREACHABLE
    health.failure("refused", now=10.0)
    assert health.snapshot(10.0).state is State.UNHEALTHY


def test_the_snapshot_tells_counts_cool_down_error_and_load() -> None:
    health = ProviderHealth(config(unhealthy_after=5), now=0.0)
    health.success()
    health.upstream_load = 3
    health.failure("a", now=20.0)
    health.failure("b", now=21.0)
    health.cool_down(until=30.0)
    health.cool_down(until=25.0)  # an earlier end does not shorten it
    assert health.snapshot(29.0) == HealthSnapshot(
        state=State.HEALTHY,
        consecutive_failures=2,
        consecutive_successes=0,
        cooling_down=True,
        last_error="b",
        upstream_load=3,
    )
    health.success()
    assert health.snapshot(30.0) == HealthSnapshot(
        state=State.HEALTHY,
        consecutive_failures=0,
        consecutive_successes=1,
        cooling_down=False,
        last_error=None,
        upstream_load=3,
    )


async def test_a_probe_notes_the_load_and_logs_each_transition_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(startup_grace_s=0.0)
    health = ProviderHealth(cfg, now=trio.current_time())
    alive = True

    async def probe() -> None:
        if not alive:
            raise UpstreamUnreachable("refused", provider="vllm-a")

    async def read_load() -> int | None:
        return 4

    caplog.set_level(logging.INFO, logger="trio_gateway.health")
    async with trio.open_nursery() as nursery:
        await nursery.start(probe_service, "vllm-a", cfg, health, probe, read_load)
        await trio.sleep(25)  # three probes, one transition
        assert health.upstream_load == 4
        alive = False
        with trio.fail_after(cfg.probe_interval_s * 2):  # virtual seconds: fails, never hangs
            await health.changed.wait()
        await trio.sleep(25)  # more failures, no new transition
        nursery.cancel_scope.cancel()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "provider vllm-a: starting -> healthy"),
        (logging.WARNING, "provider vllm-a: healthy -> unhealthy (probe failed: refused)"),
    ]


def test_a_new_provider_is_starting_with_nothing_counted() -> None:
    health = ProviderHealth(config(), now=0.0)
    assert health.snapshot(0.5) == HealthSnapshot(
        state=State.STARTING,
        consecutive_failures=0,
        consecutive_successes=0,
        cooling_down=False,
        last_error=None,
        upstream_load=None,
    )


async def test_each_failed_probe_inside_the_grace_is_a_warning_naming_the_url_and_reason(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo'd base_url fails its probes exactly as a loading vLLM does: in rotation for the
    grace, but every probe says so, with where it went and why it failed."""
    cfg = config(startup_grace_s=100.0, base_url="http://10.0.0.9:8000/v1/")
    health = ProviderHealth(cfg, now=trio.current_time())

    async def probe() -> None:
        raise UpstreamUnreachable("vllm-a: cannot connect (Connection refused)", provider="p")

    caplog.set_level(logging.INFO, logger="trio_gateway.health")
    async with trio.open_nursery() as nursery:
        await nursery.start(probe_service, "vllm-a", cfg, health, probe)
        await trio.sleep(35)  # probes at 0, 10, 20 and 30 s
        snapshot = health.snapshot(trio.current_time())
        assert snapshot.state is State.UNREACHABLE
        assert health.in_rotation(trio.current_time())
        assert snapshot.consecutive_failures == 4
        await trio.sleep(80)  # the grace ends at 100 s: the probe then makes it unhealthy
        nursery.cancel_scope.cancel()
    reason = "probe failed: vllm-a: cannot connect (Connection refused)"
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (
            logging.WARNING,
            f"provider vllm-a: unreachable at http://10.0.0.9:8000/v1, it has never answered "
            f"({reason}); in rotation for {left} s more of startup_grace_s",
        )
        for left in range(100, 0, -10)
    ] + [(logging.WARNING, f"provider vllm-a: unreachable -> unhealthy ({reason})")]


async def test_a_probe_that_breaks_is_a_logged_gateway_bug_not_a_provider_failure(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(startup_grace_s=0.0)
    health = ProviderHealth(cfg, now=trio.current_time())

    async def probe() -> None:
        raise KeyError("a bug")

    async with trio.open_nursery() as nursery:
        await nursery.start(probe_service, "vllm-b", cfg, health, probe)
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert health.snapshot(5.0).consecutive_failures == 0
    assert health.state is State.STARTING
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert (
        record.getMessage() == "provider vllm-b: the readiness probe itself failed (a gateway bug)"
    )
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_a_recovery_is_logged_at_info_without_an_error(caplog: pytest.LogCaptureFixture) -> None:
    health = ProviderHealth(config(unhealthy_after=1, healthy_after=1), now=0.0)
    health._grace_ends = 0.0
    health.failure("down", now=1.0)
    caplog.set_level(logging.INFO, logger="trio_gateway.health")
    log_transition("p", State.STARTING, health)
    health.success()
    log_transition("p", State.UNHEALTHY, health)
    log_transition("p", State.HEALTHY, health)  # no change, no line
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "provider p: starting -> unhealthy (down)"),
        ("INFO", "provider p: unhealthy -> healthy"),
    ]


async def test_a_refusal_of_the_probes_own_request_is_logged_once_and_keeps_it_in_rotation(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(startup_grace_s=0.0, unhealthy_after=1)
    health = ProviderHealth(cfg, now=trio.current_time())
    messages = iter(["Unsupported value: 'minimal'"] * 3 + ["Unknown name 'thinkingLevel'"] * 2)

    async def probe() -> None:
        raise UnsupportedParameter(next(messages), param="reasoning_effort", provider="p")

    async with trio.open_nursery() as nursery:
        await nursery.start(probe_service, "p", cfg, health, probe)
        await trio.sleep(cfg.probe_interval_s * 4 + 1)
        nursery.cancel_scope.cancel()
    # The provider answered every probe: it is in rotation, whatever it said of the request.
    assert health.state is State.HEALTHY
    assert health.in_rotation(trio.current_time())
    assert "Unknown name 'thinkingLevel'" in (health.last_error or "")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage().partition("rotation): ")[2] for r in errors] == [
        "Unsupported value: 'minimal'",
        "Unknown name 'thinkingLevel'",
    ]
    assert all("field 'reasoning_effort'" in r.getMessage() for r in errors)
