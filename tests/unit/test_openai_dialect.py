"""The ``openai`` type: only OpenAI's own fields are sent; its quota error is no rate limit."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import QuotaExhausted, UpstreamRateLimited
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.openai.dialect import OpenAIDialect, build_body

PROVIDER = ProviderConfig(
    name="gpt",
    type="openai",
    model="gpt-5-mini",
    api_key_env="K",
    capabilities=frozenset({Capability.REASONING, Capability.TOOLS}),
)


def body_for(provider: ProviderConfig = PROVIDER, **fields: Any) -> dict[str, Any]:
    request = validate_chat_body(
        {"model": "alias", "messages": [{"role": "user", "content": "hi"}], **fields}
    )
    return build_body(request, provider)


def test_vllm_extensions_and_gateway_fields_are_not_sent() -> None:
    body = body_for(
        top_k=5,
        chat_template_kwargs={"enable_thinking": False},
        reasoning=True,
        seed=7,
        functions=[{"name": "f", "parameters": {}}],
    )
    assert body == {
        "messages": [{"role": "user", "content": "hi"}],
        "seed": 7,
        "functions": [{"name": "f", "parameters": {}}],
        "model": "gpt-5-mini",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 7}, {"max_completion_tokens": 7}),
        ({"max_tokens": 7, "max_completion_tokens": 9}, {"max_completion_tokens": 9}),
        ({"reasoning": False}, {"reasoning_effort": "minimal"}),
        ({"reasoning_effort": "high"}, {"reasoning_effort": "high"}),
        ({"reasoning_effort": "low", "reasoning": True}, {"reasoning_effort": "low"}),
    ],
)
def test_max_tokens_and_reasoning_in_openais_words(
    fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    body = body_for(**fields)
    assert {k: body[k] for k in expected} == expected
    assert "max_tokens" not in body


def test_strip_fields_and_a_model_that_does_not_reason() -> None:
    plain = attrs.evolve(PROVIDER, capabilities=frozenset(), strip_fields=("max_tokens", "seed"))
    body = body_for(plain, max_tokens=7, seed=1, reasoning_effort="high")
    assert "max_completion_tokens" not in body
    assert "seed" not in body
    assert "reasoning_effort" not in body


def test_insufficient_quota_is_not_a_rate_limit() -> None:
    dialect = OpenAIDialect()
    quota = json.dumps(
        {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}
    ).encode()
    error = dialect.classify_error("gpt", 429, quota, {})
    assert isinstance(error, QuotaExhausted)
    assert (error.status, error.code, error.retryable) == (429, "quota_exhausted", False)
    limited = json.dumps({"error": {"message": "slow", "code": "rate_limit_exceeded"}}).encode()
    error = dialect.classify_error("gpt", 429, limited, {"retry-after": "3"})
    assert isinstance(error, UpstreamRateLimited)
    assert error.retry_after_s == 3.0


def test_the_call_goes_to_chat_completions_with_a_bearer_key() -> None:
    request = validate_chat_body({"model": "a", "messages": [{"role": "user", "content": "x"}]})
    call = OpenAIDialect().build_call(request, PROVIDER)
    assert call.url == "https://api.openai.com/v1/chat/completions"
    assert OpenAIDialect().auth_headers("sk-x") == {"authorization": "Bearer sk-x"}
