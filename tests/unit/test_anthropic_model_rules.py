"""The anthropic type sends each Claude model what its family takes: the 4.5 models refuse
``temperature`` and ``top_p`` together; what is sent, the simulator's own table accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.anthropic.dialect import AnthropicDialect
from trio_gateway.sim.vendor_models import anthropic_refusal


def sent(model: str, **fields: Any) -> dict[str, Any]:
    provider = ProviderConfig(
        name="claude",
        type="anthropic",
        model=model,
        api_key_env="K",
        capabilities=frozenset({Capability.REASONING}),
    )
    request = validate_chat_body(
        {"model": "alias", "messages": [{"role": "user", "content": "hi"}], **fields}
    )
    body: dict[str, Any] = json.loads(AnthropicDialect().build_call(request, provider).body)
    assert anthropic_refusal(model, body) is None
    return body


@pytest.mark.parametrize(
    ("model", "fields", "sampling"),
    [
        ("claude-sonnet-4-5-20250929", {"temperature": 0.3, "top_p": 0.9}, {"temperature": 0.3}),
        ("claude-haiku-4-5", {"temperature": 0.3, "top_p": 0.9}, {"temperature": 0.3}),
        ("claude-opus-4-5", {"top_p": 0.9}, {"top_p": 0.9}),
        (
            "claude-sonnet-4-20250514",
            {"temperature": 0.3, "top_p": 0.9},
            {"temperature": 0.3, "top_p": 0.9},
        ),
        (
            "claude-sonnet-4-5",
            {"temperature": 0.3, "top_p": 0.9, "reasoning": True},
            {"top_p": 0.95},
        ),
    ],
)
def test_temperature_and_top_p_as_the_model_takes_them(
    model: str, fields: dict[str, Any], sampling: dict[str, Any]
) -> None:
    body = sent(model, **fields)
    assert {k: body[k] for k in ("temperature", "top_p") if k in body} == sampling
