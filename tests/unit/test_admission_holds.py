"""A budget hold counts what the request, as each provider's vendor receives it, may produce:
the Router asks each provider's dialect (``Router.admit``), and ``Limits.admit`` holds the
costliest of them."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from tests.unit.test_mut_pipeline import answer
from tests.unit.test_mut_upstream import shell
from trio_gateway.accounting.admission import Limits, Reserve, local_limits
from trio_gateway.accounting.limit_store import AdmitArgs, AdmitResult, MemoryStore
from trio_gateway.accounting.limits import NANOS_PER_TOKEN_PER_PRICE
from trio_gateway.config.schema import AliasConfig, ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.request import validate_chat_body
from trio_gateway.core.usage import UsageRecord, estimate_prompt_tokens
from trio_gateway.dispatch.router import Router
from trio_gateway.providers.anthropic.request import build_body

KEY = ApiKey(name="alice", digest=b"", budget=1000.0)
MESSAGES = [{"role": "user", "content": "hello there"}]
PROMPT = estimate_prompt_tokens(MESSAGES)


class Recording(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.admitted: list[AdmitArgs] = []

    async def admit(self, args: AdmitArgs) -> AdmitResult:
        self.admitted.append(args)
        return await super().admit(args)


def recording_limits() -> tuple[Limits, Recording]:
    store = Recording()
    return Limits(store, timeout_s=1.0, fail_open=False, hold_ttl_s=60), store


def priced(name: str, kind: str, model: str, output: float, **fields: Any) -> ProviderConfig:
    return ProviderConfig(
        name=name,
        type=kind,  # type: ignore[arg-type]
        model=model,
        base_url="http://upstream.test",
        price_output_per_mtok=output,
        **fields,
    )


def nanos_out(tokens: int, price: float) -> int:
    return int(tokens * price * NANOS_PER_TOKEN_PER_PRICE)


async def test_the_hold_is_the_costliest_provider_at_its_own_output_ceiling() -> None:
    limits, store = recording_limits()
    cheap_long = priced("a", "gemini", "gemini-2.5-pro", output=1.0)
    dear_short = priced("b", "anthropic", "claude-3-5-haiku", output=10.0)
    body: dict[str, object] = {"messages": MESSAGES}
    reserves = (Reserve(cheap_long, 65_536), Reserve(dear_short, 4096))
    admission = await limits.admit(KEY, body, reserves)
    assert admission is not None and admission.hold_id is not None
    [args] = store.admitted
    # 65536 x 1 against 4096 x 10: the first is costlier, at its own ceiling. (Priced at the
    # dearest price and the longest ceiling together, as before, it would be 655360 x 10.)
    assert args.hold == nanos_out(65_536, 1.0)
    # tpm counts the client's limit, else the alias's default_max_tokens, as before.
    assert args.tokens == PROMPT + 4096


def plan_for(*providers: ProviderConfig, fields: dict[str, Any]) -> tuple[Router, Any, Any]:
    upstreams = {p.name: shell(answer, **attrs.asdict(p, recurse=False)) for p in providers}
    router = Router({"a": AliasConfig(providers=providers)}, upstreams)
    request = validate_chat_body({"model": "a", "messages": MESSAGES, **fields})
    return router, request, router.plan(request)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"max_tokens": 100, "reasoning_effort": "high"},
        {"reasoning": True},
        {"max_completion_tokens": 50_000, "reasoning_effort": "xhigh"},
    ],
)
async def test_an_anthropic_hold_is_the_max_tokens_sent(fields: dict[str, Any]) -> None:
    """Whatever the thinking budget, the hold counts exactly the max_tokens Anthropic is sent
    (the gateway once sent budget + the client's 100 while holding 100)."""
    claude = priced(
        "c",
        "anthropic",
        "claude-3-5-haiku",
        output=4.0,
        default_max_tokens=20_000,
        capabilities=frozenset({Capability.REASONING}),
    )
    router, request, plan = plan_for(claude, fields=fields)
    router.limits, store = recording_limits()
    await router.admit(KEY, request, plan)
    [args] = store.admitted
    sent = build_body(request, claude)["max_tokens"]
    assert sent <= 8192  # Claude 3.5 Haiku's output cap
    assert args.hold == nanos_out(sent, 4.0)


async def test_a_request_without_a_limit_is_held_at_the_models_cap() -> None:
    flash = priced("g", "gemini", "gemini-2.0-flash", output=1.0)
    own = priced("o", "openai", "gpt-9", output=1.0, max_output_tokens=3000)
    for provider, ceiling in ((flash, 8192), (own, 3000)):
        router, request, plan = plan_for(provider, fields={})
        router.limits, store = recording_limits()
        await router.admit(KEY, request, plan)
        assert [a.hold for a in store.admitted] == [nanos_out(ceiling, 1.0)]


async def test_a_key_without_limits_is_not_held() -> None:
    router, request, plan = plan_for(priced("g", "gemini", "gemini-2.0-flash", 1.0), fields={})
    router.limits = local_limits()
    assert await router.admit(None, request, plan) is None
    assert await router.admit(ApiKey(name="free", digest=b""), request, plan) is None


async def test_settling_bills_the_answering_providers_prices_as_admitted() -> None:
    limits, store = recording_limits()
    a = priced("a", "gemini", "gemini-2.0-flash", output=1.0)
    b = priced("b", "gemini", "gemini-2.0-flash", output=3.0)
    body: dict[str, object] = {"messages": MESSAGES, "max_tokens": 10}
    admitted = []
    for _ in range(3):
        admission = await limits.admit(KEY, body, (Reserve(a, 10), Reserve(b, 10)))
        assert admission is not None
        admitted.append(admission)
    assert set(admitted[0].prices) == {"a", "b"}

    def answered_by(provider: str | None) -> UsageRecord:
        return UsageRecord(
            request_id="r",
            key="alice",
            alias="a",
            provider=provider,
            outcome="completed",
            completion_tokens=7,
            started_at=0.0,
        )

    await limits.settle(admitted[0], answered_by("b"))
    assert store.spent("alice") == nanos_out(7, 3.0)
    # Not a provider it was admitted for (none answered): nothing billed, the hold dropped.
    await limits.settle(admitted[1], answered_by(None))
    await limits.settle(admitted[2], answered_by("c"))
    assert store.spent("alice") == nanos_out(7, 3.0)
    assert store.held("alice") == 0
