"""What an OpenAI model takes, applied to a Chat Completions body. Pure.

The rules are the model family's (``core/model_families.py``; docs/providers.md, "Model
families"): how reasoning is turned off or down, the sampling fields the model refuses, its
output cap. A model of no known family gets nothing the gateway would add on its own.
"""

from __future__ import annotations

from typing import Any

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import UnsupportedParameter
from trio_gateway.core.model_families import OpenAIFamily, openai_family
from trio_gateway.core.request import ChatRequest
from trio_gateway.providers.output_caps import known_output_cap


def family_of(provider: ProviderConfig) -> OpenAIFamily | None:
    return openai_family(provider.model, provider.model_family)


def off_effort(family: OpenAIFamily, provider: ProviderConfig) -> str:
    """The ``reasoning_effort`` that says "reasoning: false" to the family's models; raises
    ``UnsupportedParameter`` for a model that cannot stop reasoning, unless the provider is
    configured to send its lowest effort instead (``reasoning_off = "lowest"``)."""
    if family.off is not None:
        return family.off
    if provider.reasoning_off == "lowest":
        return family.efforts[0]
    raise UnsupportedParameter(
        f"'reasoning': false cannot be honoured by {provider.model!r}: it always reasons (its "
        f"least reasoning_effort is {family.efforts[0]!r}); ask for that, or use an alias "
        "whose model can stop reasoning",
        param="reasoning",
    )


def apply_model_rules(body: dict[str, Any], request: ChatRequest, provider: ProviderConfig) -> None:
    """Set ``reasoning_effort`` and drop what the provider's model refuses, in place.

    ``reasoning_effort`` goes only to a provider with the ``reasoning`` capability. There, a
    client's own effort goes as it is, except that "off" (``reasoning: false``, or an effort of
    ``none``) becomes what the family turns reasoning off with: ``minimal`` for gpt-5, ``none``
    for gpt-5.1, a 400 for the o-series. A model of no known family is sent no effort the
    client did not give.
    """
    family = family_of(provider)
    reasons = Capability.REASONING in provider.capabilities
    if not reasons or (family is not None and not family.efforts):
        # A model that does not reason (or takes no effort) rejects the field.
        body.pop("reasoning_effort", None)
    elif (
        family is not None
        and request.reasoning is False
        and "reasoning_effort" not in provider.strip_fields
    ):
        body["reasoning_effort"] = off_effort(family, provider)
    if family is None:
        return
    effort = body.get("reasoning_effort") or family.default_effort
    if not (family.sampling_at_effort_none and effort == "none"):
        # "Only the default (1) value is supported": left out, the model uses its default.
        for field in family.refused_sampling:
            body.pop(field, None)
    limit = body.get("max_completion_tokens")
    cap = known_output_cap(provider)
    if isinstance(limit, int) and cap is not None and limit > cap:
        # An upper bound the model cannot reach anyway: the same answer, without the 400.
        body["max_completion_tokens"] = cap
