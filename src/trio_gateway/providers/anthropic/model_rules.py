"""What an Anthropic model takes, applied to a Messages body. Pure.

The rules are the model family's (``core/model_families.py``; docs/providers.md, "Model
families"). Thinking and its sampling limits are the request's business (``request.py``: with
thinking on, no ``temperature`` but 1 and ``top_p`` at least 0.95); what differs by model is
here: the 4.5 models refuse ``temperature`` and ``top_p`` together.
"""

from __future__ import annotations

from typing import Any

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.model_families import AnthropicFamily, anthropic_family


def family_of(provider: ProviderConfig) -> AnthropicFamily | None:
    return anthropic_family(provider.model, provider.model_family)


def apply_model_rules(body: dict[str, Any], provider: ProviderConfig) -> dict[str, Any]:
    """``body`` without what the provider's model refuses (in place, and returned)."""
    family = family_of(provider)
    if family is None:
        return body
    if family.one_of_temperature_top_p and "temperature" in body and "top_p" in body:
        # "`temperature` and `top_p` cannot both be specified for this model": the client's
        # temperature is kept, Anthropic's advice for most uses.
        del body["top_p"]
    return body
