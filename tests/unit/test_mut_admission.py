"""Admission's arithmetic and wording: what a keyed request is charged at the door, what its
refusals say, which hold it gets (mutation testing, docs/testing.md)."""

from __future__ import annotations

import pytest
import trio

from trio_gateway.accounting.admission import Limits, Reserve, local_limits
from trio_gateway.accounting.limit_store import AdmitArgs, AdmitResult, MemoryStore
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import BudgetExceeded, RateLimited
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.usage import estimate_body_prompt

OPENAI = ProviderConfig(name="o", type="openai", model="gpt-4o", default_max_tokens=300)
MESSAGES = [{"role": "user", "content": "hello there"}]
PROMPT = estimate_body_prompt({"messages": MESSAGES}, RequestKind.CHAT)


class _Recording(MemoryStore):
    """The in-process store, keeping every admit's arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[AdmitArgs] = []

    async def admit(self, args: AdmitArgs) -> AdmitResult:
        self.calls.append(args)
        return await super().admit(args)


def _limits() -> tuple[Limits, _Recording]:
    store = _Recording()
    return Limits(store, timeout_s=1.0, fail_open=False, hold_ttl_s=60), store


async def test_the_client_limit_is_read_from_max_completion_tokens_first() -> None:
    limits, store = _limits()
    key = ApiKey(name="k", digest=b"", tpm=100_000)
    body = {"messages": MESSAGES, "max_completion_tokens": 7, "max_tokens": 99}
    await limits.admit(key, body, (Reserve(OPENAI, 7),))
    assert store.calls[-1].tokens == PROMPT + 7


async def test_without_a_limit_the_providers_default_or_4096_is_counted() -> None:
    limits, store = _limits()
    key = ApiKey(name="k", digest=b"", tpm=100_000)
    await limits.admit(key, {"messages": MESSAGES}, (Reserve(OPENAI, 300),))
    assert store.calls[-1].tokens == PROMPT + 300
    await limits.admit(key, {"messages": MESSAGES}, ())
    assert store.calls[-1].tokens == PROMPT + 4096


async def test_media_is_counted_by_the_rules_of_the_providers_that_may_answer() -> None:
    limits, store = _limits()
    key = ApiKey(name="k", digest=b"", tpm=100_000)
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    body = {"messages": [{"role": "user", "content": [image]}], "max_tokens": 1}
    openai_only = estimate_body_prompt(body, RequestKind.CHAT, ("openai",))
    assert openai_only != estimate_body_prompt(body, RequestKind.CHAT)
    await limits.admit(key, body, (Reserve(OPENAI, 1),))
    assert store.calls[-1].tokens == openai_only + 1


async def test_only_a_key_with_a_budget_gets_a_hold() -> None:
    limits, store = _limits()
    rated = await limits.admit(ApiKey(name="r", digest=b"", rpm=5), {"messages": MESSAGES}, ())
    assert rated is not None and rated.hold_id is None
    assert store.calls[-1].budget is None and store.calls[-1].hold_id == ""
    budgeted = await limits.admit(
        ApiKey(name="b", digest=b"", budget=1.0), {"messages": MESSAGES}, (Reserve(OPENAI, 5),)
    )
    assert budgeted is not None and budgeted.hold_id is not None
    assert len(budgeted.hold_id) == 16 and int(budgeted.hold_id, 16) >= 0
    assert store.calls[-1].hold_id == budgeted.hold_id


async def test_with_no_provider_to_price_nothing_is_held() -> None:
    limits = local_limits()
    admission = await limits.admit(
        ApiKey(name="b", digest=b"", budget=0.0), {"messages": MESSAGES}, ()
    )
    assert admission is not None and admission.hold_id is not None


@pytest.mark.parametrize(
    ("key", "limits_text"),
    [
        (ApiKey(name="a", digest=b"", rpm=1), "(rpm: 1, tpm: -)"),
        (ApiKey(name="a", digest=b"", tpm=PROMPT + 10), f"(rpm: -, tpm: {PROMPT + 10})"),
    ],
)
async def test_a_rate_refusal_names_the_limits_the_key_has(key: ApiKey, limits_text: str) -> None:
    limits = local_limits()
    body = {"messages": MESSAGES, "max_tokens": 10}
    await limits.admit(key, body, ())
    with pytest.raises(RateLimited) as refused:
        await limits.admit(key, body, ())
    assert limits_text in refused.value.message
    assert f"this request counts {PROMPT + 10} tokens" in refused.value.message


class _RefusesNow(MemoryStore):
    async def admit(self, args: AdmitArgs) -> AdmitResult:
        await trio.lowlevel.checkpoint()
        return AdmitResult(refused="rate", retry_after_s=0.0)


async def test_a_rate_refusal_always_asks_for_some_wait() -> None:
    limits = Limits(_RefusesNow(), timeout_s=1.0, fail_open=False, hold_ttl_s=60)
    with pytest.raises(RateLimited) as refused:
        await limits.admit(ApiKey(name="a", digest=b"", rpm=1), {"messages": MESSAGES}, ())
    assert refused.value.retry_after_s == 0.001


async def test_a_budget_refusal_gives_back_the_tokens_in_its_headers() -> None:
    limits = local_limits()
    key = ApiKey(name="a", digest=b"", rpm=10, tpm=1000, budget=0.0)
    pricey = ProviderConfig(name="p", type="openai", model="gpt-4o", price_output_per_mtok=1.0)
    with pytest.raises(BudgetExceeded) as refused:
        await limits.admit(key, {"messages": MESSAGES, "max_tokens": 100}, (Reserve(pricey, 100),))
    assert refused.value.message == (
        "API key 'a' has 0.000000 of its budget left (after running requests' holds); this "
        "request may cost up to 0.000100 (prompt estimate + the most output the alias's "
        "costliest provider may produce for it): lower max_tokens, or raise the budget; its "
        "budget (0 for the key's whole life: budget_period none) does not renew"
    )
    headers = dict(refused.value.rate_headers)
    assert headers[b"x-ratelimit-remaining-requests"] == b"10"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"1000"
    # Whole again at once, but for a float's rounding of the time given back.
    assert headers[b"x-ratelimit-reset-tokens"] in (b"0ms", b"1ms")


def test_in_process_limits_refuse_when_their_store_fails_and_hold_15_minutes() -> None:
    limits = local_limits()
    assert (limits.fail_open, limits.hold_ttl_s, limits.timeout_s) == (False, 900.0, 1.0)
    assert local_limits(30.0).hold_ttl_s == 30.0
