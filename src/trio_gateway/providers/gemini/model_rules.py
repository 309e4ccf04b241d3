"""What a Gemini model takes: its ``thinkingConfig`` and its output cap. Pure.

The rules are the model family's (``core/model_families.py``; docs/providers.md, "Model
families"): 2.5-class models take a ``thinkingBudget`` (2.5 Flash stops thinking at 0, 2.5 Pro
cannot stop and takes 128 at least), Gemini 3 a ``thinkingLevel`` (never with a budget). A model
of no known family is sent only what every thinking model takes: ``includeThoughts``.
"""

from __future__ import annotations

from typing import Any

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import UnsupportedParameter
from trio_gateway.core.model_families import GeminiFamily, gemini_family, nearest_effort
from trio_gateway.core.request import ChatRequest
from trio_gateway.providers.output_caps import known_output_cap
from trio_gateway.providers.translate import budget_for


def family_of(provider: ProviderConfig) -> GeminiFamily | None:
    return gemini_family(provider.model, provider.model_family)


def _least(family: GeminiFamily) -> dict[str, Any]:
    if family.levels:
        return {"thinkingLevel": family.levels[0]}
    assert family.budget is not None  # a family that thinks takes levels or a budget
    return {"thinkingBudget": family.budget[0]}


def _off(family: GeminiFamily, provider: ProviderConfig) -> dict[str, Any]:
    if isinstance(family.off, str):
        return {"thinkingLevel": family.off}
    if family.off is not None:
        return {"thinkingBudget": family.off}
    if provider.reasoning_off == "lowest":
        return _least(family)
    least = next(iter(_least(family).items()))
    raise UnsupportedParameter(
        f"'reasoning': false cannot be honoured by {provider.model!r}: it always thinks (its "
        f"least is {least[0]} {least[1]!r}); ask for reasoning_effort 'low', or use an alias "
        "whose model can stop thinking",
        param="reasoning",
    )


def thinking_config(request: ChatRequest, provider: ProviderConfig) -> dict[str, Any] | None:
    """``generationConfig.thinkingConfig``, for a provider with the ``reasoning`` capability.

    - reasoning on: ``includeThoughts`` and the effort (``reasoning_effort``, ``medium`` when
      none is given) as the family takes it: a budget (``translate.EFFORT_BUDGET_TOKENS``,
      within the family's range) or the nearest level;
    - reasoning off: what turns the family's thinking off (a budget of 0, the ``MINIMAL``
      level); a 400 naming the model for one that cannot stop, unless the provider sends its
      least instead (``reasoning_off = "lowest"``);
    - not said: ``{includeThoughts: true}``: the model's default, and when it thinks the
      thoughts arrive as reasoning instead of being billed unseen.

    Never both a budget and a level. A provider without the capability, or a model that
    cannot think, gets no thinkingConfig at all: they refuse one. A model of no known family
    gets ``includeThoughts`` alone, on or not said; nothing when off.
    """
    if Capability.REASONING not in provider.capabilities:
        return None
    family = family_of(provider)
    if family is not None and not family.thinks:
        return None
    if request.reasoning is False:
        return None if family is None else _off(family, provider)
    out: dict[str, Any] = {"includeThoughts": True}
    if request.reasoning and family is not None:
        effort = request.body.get("reasoning_effort")
        if family.levels:
            out["thinkingLevel"] = nearest_effort(effort or "medium", family.levels)
        else:
            assert family.budget is not None
            low, high = family.budget
            out["thinkingBudget"] = min(max(budget_for(effort), low), high)
    return out


def output_cap(provider: ProviderConfig) -> int | None:
    """The most output tokens the provider's model gives (None: unknown)."""
    return known_output_cap(provider)
