"""A probe that got an answer is not "loading": only refused connections and timeouts keep a
provider in its start-up grace. An answer naming the model or the route (a 404: vLLM's "The model
`x` does not exist.", OpenAI's, Anthropic's, Gemini's) makes it unhealthy at once; a refusal of
the probe's parameters still never locks it out."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from tests.unit.test_health import config, state_of
from trio_gateway.capacity.health import ProviderHealth, State, could_be_loading, probe_service
from trio_gateway.core.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotServed,
    UnsupportedParameter,
    UpstreamAuthFailed,
    UpstreamProtocolError,
    UpstreamServerError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from trio_gateway.providers.anthropic.errors import classify_error as classify_anthropic
from trio_gateway.providers.errors import classify_status
from trio_gateway.providers.gemini.errors import classify_error as classify_google

VLLM_404 = (
    b'{"error":{"message":"The model `qwen3-8b` does not exist. Valid aliases: qwen3-32b.",'
    b'"type":"NotFoundError","param":"model","code":404}}'
)


@pytest.mark.parametrize(
    ("error", "loading"),
    [
        (UpstreamUnreachable("p: cannot connect (refused)"), True),
        (UpstreamTimeout("p: timed out"), True),
        (UpstreamServerError("p answered HTTP 500: boom"), False),
        (UpstreamAuthFailed("p rejected the gateway's credentials (HTTP 401)"), False),
        (UpstreamProtocolError("p answered unexpected HTTP 101"), False),
        (ModelNotServed("p does not serve the configured model (HTTP 404)"), False),
    ],
)
def test_only_a_refused_connection_or_a_timeout_could_be_a_provider_still_loading(
    error: GatewayError, loading: bool
) -> None:
    assert could_be_loading(error) is loading


def test_an_answered_failure_inside_the_grace_counts_as_after_it() -> None:
    health = ProviderHealth(config(unhealthy_after=2, startup_grace_s=100.0), now=0.0)
    health.failure("p answered HTTP 503", now=1.0, answered=True)
    assert state_of(health) is State.UNREACHABLE
    health.failure("p answered HTTP 503", now=2.0, answered=True)
    assert state_of(health) is State.UNHEALTHY
    # The same two refused connections would have kept it in rotation for the grace.
    loading = ProviderHealth(config(unhealthy_after=2, startup_grace_s=100.0), now=0.0)
    for now in (1.0, 2.0, 3.0):
        loading.failure("p: cannot connect", now=now)
    assert loading.state is State.UNREACHABLE


def test_a_provider_not_serving_is_unhealthy_at_once_and_comes_back_after_successes() -> None:
    health = ProviderHealth(config(unhealthy_after=3, healthy_after=2), now=0.0)
    health.not_serving("p does not serve the configured model (HTTP 404): no model")
    assert health.state is State.UNHEALTHY
    assert not health.in_rotation(1.0)
    assert health.last_error == "p does not serve the configured model (HTTP 404): no model"
    health.success()
    assert state_of(health) is State.UNHEALTHY
    health.success()
    assert state_of(health) is State.HEALTHY


@pytest.mark.parametrize(
    "error",
    [
        classify_status("vllm", 404, VLLM_404),
        classify_status("vllm", 404, b"Not Found"),  # a base_url with the wrong path
        classify_anthropic(
            "claude",
            404,
            b'{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}',
            {},
        ),
        classify_google(
            "gemini",
            404,
            b'{"error":{"code":404,"message":"models/gemini-9 is not found for API version '
            b'v1beta","status":"NOT_FOUND"}}',
            {},
        ),
    ],
)
def test_every_vendors_404_is_a_model_not_served(error: GatewayError) -> None:
    # Still upstream_error to a client, and the next provider is still tried.
    assert isinstance(error, ModelNotServed)
    assert isinstance(error, UpstreamServerError)
    assert error.code == "upstream_error"


async def run_probes(
    probe_error: GatewayError, **fields: object
) -> tuple[ProviderHealth, list[State]]:
    cfg = config(**fields)
    health = ProviderHealth(cfg, now=trio.current_time())
    states: list[State] = []

    async def probe() -> None:
        states.append(health.state)
        raise probe_error

    async with trio.open_nursery() as nursery:
        await nursery.start(probe_service, "p", cfg, health, probe)
        await trio.sleep(cfg.probe_interval_s * 2 + 1)
        nursery.cancel_scope.cancel()
    return health, states


async def test_a_404_to_the_probe_makes_it_unhealthy_at_once_inside_the_grace(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    message = "p does not serve the configured model (HTTP 404): The model `m` does not exist."
    health, states = await run_probes(
        ModelNotServed(message, provider="p"), startup_grace_s=600.0, unhealthy_after=3
    )
    assert states[:2] == [State.STARTING, State.UNHEALTHY]
    assert health.state is State.UNHEALTHY and health.last_error == message
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    # Once, however many probes say it.
    assert len([e for e in errors if "The model `m` does not exist." in e]) == 1
    (line,) = errors
    assert line.startswith("provider p: the readiness probe's request names a model or route")
    assert "check model and base_url" in line


async def test_a_refusal_naming_the_model_is_not_a_refused_parameter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    health, _ = await run_probes(
        InvalidRequest("model 'm' not found", param="model", provider="p"), startup_grace_s=600.0
    )
    assert health.state is State.UNHEALTHY


async def test_a_refused_parameter_still_never_locks_the_provider_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    health, _ = await run_probes(
        UnsupportedParameter("Unsupported value: 'minimal'", param="reasoning_effort"),
        startup_grace_s=0.0,
        unhealthy_after=1,
    )
    assert health.state is State.HEALTHY
