"""The keys file's problems word for word, the usage records of refusals, the output caps of
Gemini's ``models/`` names and the cost arithmetic's edges (mutation testing,
docs/testing.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_auth import ALICE, entry, problems
from tests.unit.test_usage import record as usage_record_of
from trio_gateway.accounting.limits import Prices, cost_nanos, reserve_tokens
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import Forbidden
from trio_gateway.core.events import Usage
from trio_gateway.core.keys import ApiKey, KeysFileError, load_keys, parse_keys
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.usage import (
    PartialUsage,
    estimate_body_prompt,
    estimate_prompt_tokens,
    refused_record,
)
from trio_gateway.providers.output_caps import known_output_cap

BOB = "tgw-bob-secret"


def test_unknown_fields_are_named_one_or_many() -> None:
    assert problems(entry("a", ALICE, "x = 1")) == ["keys.a: unknown key 'x'"]
    assert problems(entry("a", ALICE, "x = 1\ny = 2")) == ["keys.a: unknown keys 'x', 'y'"]
    assert problems("x = 1\n" + entry("a", ALICE)) == ["(top level): unknown key 'x'"]
    assert problems("x = 1\ny = 2\n" + entry("a", ALICE)) == ["(top level): unknown keys 'x', 'y'"]


def test_an_unknown_alias_lists_the_known_ones() -> None:
    text = entry("a", ALICE, 'aliases = ["zed"]')
    assert problems(text, known_aliases={"b", "a"}) == [
        "keys.a.aliases[0]: unknown alias 'zed' (known: a, b)"
    ]


def test_a_repeated_key_does_not_hide_the_problems_after_it() -> None:
    text = entry("a", ALICE) + entry("b", ALICE) + entry("c", BOB, "rpm = 0")
    with pytest.raises(KeysFileError) as caught:
        parse_keys(text)
    assert caught.value.problems == [
        "keys.b.sha256: the same key as keys.a",
        "keys.c.rpm: must be at least 1",
    ]
    assert caught.value.keys == ("b", "c")


def test_a_budget_of_zero_is_a_budget() -> None:
    [key] = parse_keys(entry("a", ALICE, "budget = 0"))
    assert key.budget == 0.0
    assert problems(entry("a", ALICE, "budget = -0.5")) == [
        "keys.a.budget: must be a finite number, 0 or more"
    ]


def test_a_problem_names_the_text_it_came_from() -> None:
    with pytest.raises(KeysFileError) as caught:
        parse_keys("[keys.a]\n")
    assert str(caught.value) == "<keys>: keys.a.sha256: required field missing"


def test_a_keys_file_that_is_not_utf8_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(KeysFileError) as caught:
        load_keys(path)
    assert caught.value.source == str(path)
    [problem] = caught.value.problems
    assert problem.startswith("not UTF-8 text: ")
    assert str(caught.value).startswith(f"{path}: not UTF-8 text: ")


def test_a_forbidden_alias_lists_every_alias_the_key_may_use() -> None:
    key = ApiKey(name="a", digest=b"", aliases=("x", "y"))
    with pytest.raises(Forbidden) as caught:
        key.check_alias("z")
    assert caught.value.message == "this API key may not use 'z'; it may use: x, y"


def test_a_refusal_record_by_default() -> None:
    record = refused_record(
        request_id="r", key="k", alias=None, error_code="rate_limited", started_at=5.0
    )
    assert (record.outcome, record.duration_s, record.endpoint) == ("refused", 0.0, "chat")
    assert record.provider is None and record.prompt_tokens == 0


def test_a_refusal_record_of_a_client_gone() -> None:
    record = refused_record(
        request_id="r",
        key="k",
        alias="a",
        error_code="overloaded",
        started_at=5.0,
        duration_s=2.5,
        cancelled=True,
        endpoint="embeddings",
    )
    assert (record.outcome, record.duration_s, record.endpoint) == (
        "cancelled",
        2.5,
        "embeddings",
    )


def test_gemini_model_names_may_carry_models_prefix() -> None:
    provider = ProviderConfig(name="g", type="gemini", model="models/gemini-2.0-flash")
    assert known_output_cap(provider) == 8_192


def test_cached_tokens_never_exceed_an_empty_prompt() -> None:
    prices = Prices(input=1.0, cached_input=2.0, output=0.0)
    assert cost_nanos(prices, 0, 5, 0) == 0


def test_a_cost_rounds_to_a_millionth_of_a_nano_before_rounding_up() -> None:
    # 1.0000001 nanos: float noise below the sixth decimal is not a nano more.
    assert cost_nanos(Prices(input=0.0010000001), 1, 0, 0) == 1
    assert cost_nanos(Prices(input=0.00100001), 1, 0, 0) == 2


def test_a_limit_of_one_token_is_a_limit() -> None:
    assert reserve_tokens(10, 1, 4096) == 11


def test_no_messages_is_no_prompt() -> None:
    assert estimate_prompt_tokens([]) == 0
    assert estimate_prompt_tokens(None) == 0
    assert estimate_body_prompt({}, RequestKind.CHAT) == 0


def test_a_chat_s_media_is_counted_by_the_given_vendors() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    body = {"messages": [{"role": "user", "content": [image]}]}
    openai = estimate_body_prompt(body, RequestKind.CHAT, ("openai",))
    assert openai == estimate_prompt_tokens(body["messages"], ("openai",))
    assert openai < estimate_body_prompt(body, RequestKind.CHAT)


def test_a_record_comes_from_the_chat_endpoint_unless_told() -> None:
    assert usage_record_of().endpoint == "chat"
    assert usage_record_of(endpoint="embeddings").endpoint == "embeddings"


def test_counts_the_vendor_sent_are_never_estimated() -> None:
    # The vendor's own counts, cut before it counted the prompt: the prompt stays unknown (0).
    partial = PartialUsage(Usage(0, 4), estimated=False)
    cut = usage_record_of(usage=None, partial=partial, prompt_estimate=lambda: 99)
    assert (cut.prompt_tokens, cut.completion_tokens, cut.estimated) == (0, 4, False)


def test_missing_counts_are_zero() -> None:
    nothing = usage_record_of(usage=None, partial=None)
    assert (nothing.reasoning_tokens, nothing.cached_tokens, nothing.prompt_tokens) == (0, 0, 0)
    bare = usage_record_of(usage=Usage(3, 2), partial=None)
    assert (bare.reasoning_tokens, bare.cached_tokens) == (0, 0)
