"""``relay.record``: one request's usage record, metrics, status-page sample and access-log
fields, from how it ended. Without a server: the e2e tests see these only in part.

Written for mutation testing (docs/testing.md): every field and every label a dashboard or an
invoice reads is pinned here.
"""

from __future__ import annotations

from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from tests.unit.test_mut_upstream import chat, shell
from trio_gateway.accounting.admission import Limits
from trio_gateway.config.schema import AliasConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import (
    CapabilityUnavailable,
    Overloaded,
    ShuttingDown,
    UpstreamUnreachable,
)
from trio_gateway.core.events import Usage
from trio_gateway.core.usage import PartialUsage, UsageRecord
from trio_gateway.dispatch.relay import CLIENT_GONE, Outcome, record
from trio_gateway.dispatch.router import Router
from trio_gateway.ops.access import RequestContext, request_context
from trio_gateway.ops.tracing import new_trace


async def unused(request: httpx.Request) -> httpx.Response:
    raise AssertionError("record() sends nothing upstream")


@attrs.define
class Sink:
    records: list[UsageRecord] = attrs.field(factory=list)

    def offer(self, record: UsageRecord) -> bool:
        self.records.append(record)
        return True


def router() -> tuple[Router, Sink]:
    upstream = shell(unused)
    gateway = Router({"a": AliasConfig(providers=(upstream.config,))}, {"p1": upstream})
    sink = Sink()
    gateway.usage = sink
    return gateway, sink


def sample(gateway: Router, name: str, **labels: str) -> float | None:
    return gateway.metrics.registry.get_sample_value(name, labels)


async def test_a_completed_answer_is_recorded_everywhere(autojump_clock: trio.abc.Clock) -> None:
    await trio.sleep(100.0)  # not at the clock's zero: a difference turned sum shows
    gateway, sink = router()
    request = attrs.evolve(chat(), key_name="team-a")
    plan = gateway.plan(request)
    started = trio.current_time()
    await trio.sleep(0.25)
    outcome = Outcome(provider="p1")
    outcome.observe(
        Usage(prompt_tokens=3, completion_tokens=5, reasoning_tokens=2, cached_tokens=1)
    )
    assert outcome.first_event_at == started + 0.25
    await trio.sleep(0.75)
    context = RequestContext(request_id="r1", route="POST /v1/chat/completions", trace=new_trace())
    with request_context(context):
        rec = record(plan, outcome, started, request=request, request_id="r1", started_wall=1e9)
    assert rec == UsageRecord(
        request_id="r1",
        key="team-a",
        alias="a",
        provider="p1",
        outcome="completed",
        error_code=None,
        prompt_tokens=3,
        completion_tokens=5,
        reasoning_tokens=2,
        cached_tokens=1,
        estimated=False,
        ttft_s=0.25,
        duration_s=1.0,
        started_at=1e9,
        priority=0,
    )
    assert sink.records == [rec]
    assert context.priority == 0
    assert (
        sample(gateway, "gateway_requests_by_priority_total", alias="a", priority="0", outcome="ok")
        == 1
    )
    assert (context.alias, context.provider, context.key, context.outcome) == (
        "a",
        "p1",
        "team-a",
        "completed",
    )
    assert (
        sample(gateway, "gateway_requests_total", alias="a", provider="p1", outcome="ok", code="")
        == 1
    )
    for kind, count in (("prompt", 3), ("completion", 5), ("reasoning", 2)):
        assert sample(gateway, "gateway_tokens_total", alias="a", provider="p1", kind=kind) == count
    assert (
        sample(gateway, "gateway_time_to_first_token_seconds_sum", alias="a", provider="p1") == 0.25
    )
    assert (
        sample(gateway, "gateway_time_to_first_token_seconds_count", alias="a", provider="p1") == 1
    )
    assert sample(gateway, "gateway_request_duration_seconds_sum", alias="a", provider="p1") == 1.0
    assert sample(gateway, "gateway_cancellations_total", cause=CLIENT_GONE) is None
    summary = gateway.recent.summary("p1", trio.current_time())
    assert summary["requests"] == 1 and summary["errors"] == 0
    assert summary["ttft_avg_ms"] == 250.0


async def test_no_reasoning_tokens_no_reasoning_sample(autojump_clock: trio.abc.Clock) -> None:
    gateway, _ = router()
    outcome = Outcome(provider="p1", usage=Usage(prompt_tokens=1, completion_tokens=1))
    record(gateway.plan(chat()), outcome, trio.current_time(), request=chat())
    assert (
        sample(gateway, "gateway_tokens_total", alias="a", provider="p1", kind="reasoning") is None
    )
    assert sample(gateway, "gateway_tokens_total", alias="a", provider="p1", kind="prompt") == 1


async def test_a_client_that_left_is_a_cancellation(autojump_clock: trio.abc.Clock) -> None:
    gateway, sink = router()
    partial = PartialUsage(usage=Usage(prompt_tokens=0, completion_tokens=4), estimated=True)
    outcome = Outcome(cancelled=CLIENT_GONE, provider="p1")
    outcome.meter.partial = partial
    outcome.first_event_at = trio.current_time()
    request = chat()
    [rec] = [record(gateway.plan(request), outcome, trio.current_time(), request=request)]
    assert rec.outcome == "cancelled" and rec.error_code == CLIENT_GONE
    assert rec.completion_tokens == 4 and rec.estimated
    assert rec.prompt_tokens > 0  # estimated from the messages the request carried
    assert sink.records == [rec]
    assert sample(gateway, "gateway_cancellations_total", cause=CLIENT_GONE) == 1
    assert (
        sample(
            gateway,
            "gateway_requests_total",
            alias="a",
            provider="p1",
            outcome="cancelled",
            code=CLIENT_GONE,
        )
        == 1
    )
    summary = gateway.recent.summary("p1", trio.current_time())
    assert summary["requests"] == 1 and summary["errors"] == 0


async def test_an_error_names_its_provider_and_counts_as_one(
    autojump_clock: trio.abc.Clock,
) -> None:
    await trio.sleep(100.0)
    gateway, _ = router()
    error = UpstreamUnreachable("p1 is down", provider="p1")
    outcome = Outcome(error=error)
    started = trio.current_time()
    await trio.sleep(2.0)
    rec = record(gateway.plan(chat()), outcome, started, request=chat(), request_id="r2")
    assert (rec.provider, rec.outcome, rec.error_code, rec.key) == (
        "p1",
        "failed",
        error.code,
        None,
    )
    assert rec.ttft_s is None and rec.duration_s == 2.0
    assert (
        sample(
            gateway,
            "gateway_requests_total",
            alias="a",
            provider="p1",
            outcome="error",
            code=error.code,
        )
        == 1
    )
    # No first event, no TTFT sample; the duration is observed all the same.
    assert (
        sample(gateway, "gateway_time_to_first_token_seconds_count", alias="a", provider="p1")
        is None
    )
    assert sample(gateway, "gateway_request_duration_seconds_sum", alias="a", provider="p1") == 2.0
    summary = gateway.recent.summary("p1", trio.current_time())
    assert summary["requests"] == 1 and summary["errors"] == 1


@pytest.mark.parametrize(
    ("outcome", "provider"),
    [
        (Outcome(provider="p1", error=UpstreamUnreachable("x", provider="p2")), "p1"),
        (Outcome(error=UpstreamUnreachable("x")), ""),
        (Outcome(), ""),
    ],
    ids=["answered_wins", "nobody", "nothing"],
)
async def test_the_provider_label(
    autojump_clock: trio.abc.Clock, outcome: Outcome, provider: str
) -> None:
    gateway, _ = router()
    rec = record(gateway.plan(chat()), outcome, trio.current_time(), request=chat())
    assert rec.provider == (provider or None)
    result: Any = "error" if outcome.error else "ok"
    code = outcome.error.code if outcome.error else ""
    assert (
        sample(
            gateway,
            "gateway_requests_total",
            alias="a",
            provider=provider,
            outcome=result,
            code=code,
        )
        == 1
    )


async def test_the_wall_clock_start_defaults_to_now(autojump_clock: trio.abc.Clock) -> None:
    import time

    gateway, _ = router()
    before = time.time()
    rec = record(gateway.plan(chat()), Outcome(), trio.current_time(), request=chat())
    assert before <= rec.started_at <= time.time()


async def test_a_refusal_before_the_first_event_is_refused_after_it_failed(
    autojump_clock: trio.abc.Clock,
) -> None:
    gateway, _ = router()
    refused = record(gateway.plan(chat()), Outcome(error=Overloaded("full")), 0.0, request=chat())
    assert (refused.outcome, refused.error_code, refused.request_id) == (
        "refused",
        "overloaded",
        "",
    )
    late = Outcome(error=ShuttingDown("bye"), provider="p1")
    late.first_event_at = trio.current_time()
    failed = record(gateway.plan(chat()), late, 0.0, request=chat())
    assert (failed.outcome, failed.error_code) == ("failed", "shutting_down")


async def test_the_router_keeps_local_limits_until_told_otherwise() -> None:
    gateway, _ = router()
    assert isinstance(gateway.limits, Limits)
    assert await gateway.limits.admit(None, {}, ()) is None


async def test_a_missing_capability_names_the_alias() -> None:
    gateway, _ = router()
    request = attrs.evolve(chat(), required=frozenset({Capability.VISION}))
    with pytest.raises(CapabilityUnavailable) as caught:
        gateway.plan(request)
    assert "no provider of alias 'a' offers vision" in caught.value.message
