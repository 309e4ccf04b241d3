"""The ``openai`` type sends each model what its family takes: how reasoning is turned off or
down, the sampling fields it refuses, its output cap; and what it sends, the simulator's own
table of what OpenAI's models refuse accepts."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import UnsupportedParameter
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.openai.dialect import build_body
from trio_gateway.sim.vendor_models import openai_refusal

REASONING = frozenset({Capability.REASONING})


def provider(model: str, **fields: Any) -> ProviderConfig:
    return ProviderConfig(
        name="gpt", type="openai", model=model, api_key_env="K", capabilities=REASONING, **fields
    )


def body_for(model: str, /, provider_fields: Any = None, **fields: Any) -> dict[str, Any]:
    request = validate_chat_body(
        {"model": "alias", "messages": [{"role": "user", "content": "hi"}], **fields}
    )
    return build_body(request, provider(model, **(provider_fields or {})))


@pytest.mark.parametrize(
    ("model", "effort"),
    [
        ("gpt-5", "minimal"),
        ("gpt-5-mini-2025-08-07", "minimal"),
        ("gpt-5.1", "none"),
        ("gpt-5.1-2025-11-13", "none"),
        ("gpt-5.2", "none"),
    ],
)
def test_reasoning_off_in_the_familys_words(model: str, effort: str) -> None:
    for off in ({"reasoning": False}, {"reasoning_effort": "none"}):
        body = body_for(model, **off)
        assert body["reasoning_effort"] == effort
        assert openai_refusal(model, body) is None


@pytest.mark.parametrize(
    ("model", "lowest"),
    [("o3", "low"), ("o4-mini-2025-04-16", "low"), ("gpt-5-pro", "high"), ("o1", "low")],
)
def test_a_model_that_cannot_stop_reasoning_refuses_off_or_takes_its_lowest(
    model: str, lowest: str
) -> None:
    with pytest.raises(UnsupportedParameter) as refused:
        body_for(model, reasoning=False)
    assert refused.value.param == "reasoning"
    assert refused.value.status == 400 and refused.value.code == "unsupported_parameter"
    assert repr(model) in refused.value.message
    assert f"least reasoning_effort is {lowest!r}" in refused.value.message
    body = body_for(model, {"reasoning_off": "lowest"}, reasoning=False)
    assert body["reasoning_effort"] == lowest
    assert openai_refusal(model, body) is None


def test_an_unknown_model_is_sent_no_effort_the_client_did_not_give() -> None:
    assert "reasoning_effort" not in body_for("gpt-7-turbo", reasoning=False)
    assert body_for("gpt-7-turbo", reasoning_effort="high")["reasoning_effort"] == "high"
    assert body_for("gpt-7-turbo", temperature=0.3)["temperature"] == 0.3


def test_the_provider_family_from_config_wins_over_the_name() -> None:
    body = body_for("my-deployment", {"model_family": "gpt-5.1"}, reasoning=False)
    assert body["reasoning_effort"] == "none"
    body = body_for("gpt-5.1", {"model_family": "gpt-5"}, reasoning=False)
    assert body["reasoning_effort"] == "minimal"


def test_a_model_that_does_not_reason_is_never_sent_an_effort() -> None:
    body = body_for("gpt-4o-2024-08-06", reasoning_effort="high")
    assert "reasoning_effort" not in body
    assert openai_refusal("gpt-4o", body) is None


def test_stripped_reasoning_effort_is_not_added_back() -> None:
    body = body_for("gpt-5", {"strip_fields": ("reasoning_effort",)}, reasoning=False)
    assert "reasoning_effort" not in body


@pytest.mark.parametrize(
    ("model", "fields", "kept"),
    [
        ("gpt-5", {"temperature": 0.2, "top_p": 0.5, "seed": 3}, {"seed": 3}),
        ("o3", {"temperature": 0.2, "presence_penalty": 1.0}, {}),
        ("gpt-5.1", {"temperature": 0.2}, {"temperature": 0.2}),  # its default effort is none
        ("gpt-5.1", {"temperature": 0.2, "reasoning": False}, {"temperature": 0.2}),
        ("gpt-5.1", {"temperature": 0.2, "reasoning_effort": "low"}, {}),
        ("gpt-4o", {"temperature": 0.2, "top_p": 0.5}, {"temperature": 0.2, "top_p": 0.5}),
    ],
)
def test_sampling_fields_the_model_refuses_are_not_sent(
    model: str, fields: dict[str, Any], kept: dict[str, Any]
) -> None:
    body = body_for(model, **fields)
    sampling = {"temperature", "top_p", "presence_penalty", "seed"}
    assert {k: v for k, v in body.items() if k in sampling} == kept
    assert openai_refusal(model, body) is None


def test_max_tokens_past_the_models_cap_is_lowered_to_it() -> None:
    assert body_for("gpt-4o", max_tokens=100_000)["max_completion_tokens"] == 16_384
    assert body_for("gpt-5", max_completion_tokens=1000)["max_completion_tokens"] == 1000
    assert body_for("gpt-9", max_tokens=10**6)["max_completion_tokens"] == 10**6


def test_a_provider_without_the_capability_gets_no_effort_but_the_models_rules() -> None:
    plain = attrs.evolve(provider("gpt-5"), capabilities=frozenset())
    request = validate_chat_body(
        {
            "model": "alias",
            "messages": [{"role": "user", "content": "hi"}],
            "reasoning": False,
            "temperature": 0.3,
        }
    )
    body = build_body(request, plain)
    assert "reasoning_effort" not in body and "temperature" not in body
