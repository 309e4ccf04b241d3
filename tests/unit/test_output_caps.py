"""The output caps the gateway assumes per vendor and model, and the most output a translated
request lets each vendor produce (what a budget hold is computed from)."""

from __future__ import annotations

import attrs
import pytest

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.output_caps import (
    ANTHROPIC_UNKNOWN_OUTPUT_CAP,
    GEMINI_UNKNOWN_OUTPUT_CAP,
    OPENAI_UNKNOWN_OUTPUT_CAP,
    model_output_cap,
)
from trio_gateway.providers.registry import dialect_for


def provider(kind: str, model: str, **fields: object) -> ProviderConfig:
    return ProviderConfig(name="p", type=kind, model=model, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "model", "cap"),
    [
        ("anthropic", "claude-opus-4-6", 128_000),
        ("anthropic", "claude-opus-4-5-20251101", 64_000),
        ("anthropic", "claude-opus-4-1-20250805", 32_000),
        ("anthropic", "claude-opus-4-0", 32_000),
        ("anthropic", "claude-opus-4-9", 32_000),  # a later 4.x: the family's least
        ("anthropic", "claude-sonnet-4-5-20250929", 64_000),
        ("anthropic", "claude-sonnet-4-20250514", 64_000),
        ("anthropic", "claude-haiku-4-5", 64_000),
        ("anthropic", "claude-3-7-sonnet-latest", 64_000),
        ("anthropic", "claude-3-5-haiku-20241022", 8_192),
        ("anthropic", "claude-3-5-haiku@20241022", 8_192),  # Vertex's spelling
        ("anthropic", "claude-3-haiku-20240307", 4_096),
        ("anthropic", "Claude-3-Opus-20240229", 4_096),
        ("anthropic", "qwen3-32b", ANTHROPIC_UNKNOWN_OUTPUT_CAP),
        ("openai", "gpt-4o-mini", 16_384),
        ("openai", "gpt-4.1-nano", 32_768),
        ("openai", "gpt-5.1", 128_000),
        ("openai", "gpt-5-pro", 272_000),
        ("openai", "o1-mini", 65_536),
        ("openai", "o3-mini", 100_000),
        ("openai", "ft:some-model", OPENAI_UNKNOWN_OUTPUT_CAP),
        ("gemini", "gemini-2.0-flash", 8_192),
        ("gemini", "models/gemini-2.5-pro", 65_536),
        ("vertex", "gemini-3-pro-preview", 65_536),
        ("gemini", "gemma-3", GEMINI_UNKNOWN_OUTPUT_CAP),
        # vLLM's served model is the operator's: default_max_tokens stands in.
        ("openai_compatible", "qwen3-32b", 4096),
    ],
)
def test_each_vendor_has_its_models_caps(kind: str, model: str, cap: int) -> None:
    assert model_output_cap(provider(kind, model)) == cap
    # The operator's word wins over the table.
    assert model_output_cap(provider(kind, model, max_output_tokens=777)) == 777


SOME = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("kind", "model", "fields", "held"),
    [
        # The client's limit is passed on as is: that is the most the vendor may produce.
        ("openai", "gpt-4o", {"max_tokens": 100}, 100),
        ("gemini", "gemini-2.5-flash", {"max_completion_tokens": 300, "max_tokens": 9}, 300),
        ("openai_compatible", "qwen3-32b", {"max_tokens": 50000}, 50000),
        # No limit sent: the model's cap (Gemini, OpenAI), vLLM's stand-in.
        ("openai", "gpt-4o", {}, 16_384),
        ("gemini", "gemini-2.0-flash", {}, 8_192),
        ("vertex", "gemini-2.5-pro", {"reasoning": True}, 65_536),
        ("openai_compatible", "qwen3-32b", {}, 4096),
        # Anthropic: the max_tokens sent, clamped to the cap, thinking inside it.
        ("anthropic", "claude-3-5-haiku", {}, 4096),
        ("anthropic", "claude-3-5-haiku", {"max_tokens": 100, "reasoning_effort": "high"}, 100),
        ("anthropic", "claude-3-5-haiku", {"max_tokens": 100000}, 8_192),
    ],
)
def test_the_held_output_is_what_the_vendor_is_allowed(
    kind: str, model: str, fields: dict[str, object], held: int
) -> None:
    request = validate_chat_body({**SOME, **fields})
    config = provider(kind, model)
    assert dialect_for(kind).max_output_tokens(request, config) == held


@pytest.mark.parametrize("kind", ["openai", "gemini", "openai_compatible", "anthropic"])
def test_a_stripped_limit_is_not_the_vendors(kind: str) -> None:
    request = validate_chat_body({**SOME, "max_tokens": 10})
    config = provider(kind, "m", strip_fields=("max_tokens",), max_output_tokens=3000)
    assert dialect_for(kind).max_output_tokens(request, config) == 3000
    kept = attrs.evolve(config, strip_fields=())
    assert dialect_for(kind).max_output_tokens(request, kept) == 10
