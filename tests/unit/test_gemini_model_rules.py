"""The gemini and vertex types send each model the thinkingConfig its family takes (a budget
within its range, a level, or nothing), and its output cap; what they send, Google's SDK and
the simulator's own table of what Gemini's models refuse both accept."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from tests.unit.gemini_helpers import GEMINI, body_for, check_with_sdk
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import UnsupportedParameter
from trio_gateway.sim.vendor_models import gemini_refusal


def model(name: str, **fields: Any) -> ProviderConfig:
    return attrs.evolve(GEMINI, model=name, **fields)


def thinking_for(provider: ProviderConfig, **fields: Any) -> dict[str, Any] | None:
    body = body_for(provider, **fields)
    check_with_sdk(body)
    thinking: dict[str, Any] | None = body.get("generationConfig", {}).get("thinkingConfig")
    assert gemini_refusal(provider.model, thinking or {}) is None, thinking
    return thinking


@pytest.mark.parametrize(
    ("name", "fields", "thinking"),
    [
        ("gemini-2.5-flash", {"reasoning": False}, {"thinkingBudget": 0}),
        ("gemini-2.5-flash-lite", {"reasoning_effort": "none"}, {"thinkingBudget": 0}),
        (
            "gemini-2.5-flash",
            {"reasoning_effort": "xhigh"},
            {"includeThoughts": True, "thinkingBudget": 24_576},  # its most
        ),
        (
            "gemini-2.5-flash-lite",
            {"reasoning_effort": "minimal"},
            {"includeThoughts": True, "thinkingBudget": 1024},
        ),
        (
            "gemini-2.5-pro-preview-06-05",
            {"reasoning_effort": "high"},
            {"includeThoughts": True, "thinkingBudget": 16_384},
        ),
        ("gemini-2.5-pro", {}, {"includeThoughts": True}),
        (
            "gemini-3-pro-preview",
            {"reasoning_effort": "low"},
            {"includeThoughts": True, "thinkingLevel": "LOW"},
        ),
        (
            "gemini-3-pro-preview",
            {"reasoning": True},  # medium, which 3 Pro has not: the nearer above
            {"includeThoughts": True, "thinkingLevel": "HIGH"},
        ),
        (
            "gemini-3-pro-preview",
            {"reasoning_effort": "minimal"},
            {"includeThoughts": True, "thinkingLevel": "LOW"},
        ),
        (
            "gemini-3-flash-preview",
            {"reasoning_effort": "medium"},
            {"includeThoughts": True, "thinkingLevel": "MEDIUM"},
        ),
        ("gemini-3-flash-preview", {"reasoning": False}, {"thinkingLevel": "MINIMAL"}),
        ("gemini-2.0-flash", {"reasoning_effort": "high"}, None),  # cannot think
        ("gemini-9-ultra", {"reasoning_effort": "high"}, {"includeThoughts": True}),
        ("gemini-9-ultra", {"reasoning": False}, None),
    ],
)
def test_thinking_as_the_family_takes_it(
    name: str, fields: dict[str, Any], thinking: dict[str, Any] | None
) -> None:
    assert thinking_for(model(name), **fields) == thinking


@pytest.mark.parametrize(
    ("name", "least"),
    [
        ("gemini-2.5-pro", {"thinkingBudget": 128}),
        ("gemini-3-pro-preview", {"thinkingLevel": "LOW"}),
    ],
)
def test_a_model_that_cannot_stop_thinking_refuses_off_or_takes_its_least(
    name: str, least: dict[str, Any]
) -> None:
    for off in ({"reasoning": False}, {"reasoning_effort": "none"}):
        with pytest.raises(UnsupportedParameter) as refused:
            body_for(model(name), **off)
        assert refused.value.param == "reasoning"
        assert repr(name) in refused.value.message
        assert thinking_for(model(name, reasoning_off="lowest"), **off) == least


def test_the_family_from_config_wins_over_the_name() -> None:
    renamed = model("tuned-pro-v2", model_family="gemini-2.5-pro", reasoning_off="lowest")
    assert thinking_for(renamed, reasoning=False) == {"thinkingBudget": 128}
    # The operator's word is taken, even where the name says otherwise.
    wrong = body_for(model("gemini-2.5-pro", model_family="gemini-2.5-flash"), reasoning=False)
    assert wrong["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 0}


def test_max_tokens_past_the_models_cap_is_lowered_to_it() -> None:
    config = body_for(model("gemini-2.0-flash"), max_tokens=100_000)["generationConfig"]
    assert config["maxOutputTokens"] == 8192
    config = body_for(model("gemini-9-ultra"), max_tokens=100_000)["generationConfig"]
    assert config["maxOutputTokens"] == 100_000
