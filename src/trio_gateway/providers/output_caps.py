"""How many tokens a request may make a model produce: each vendor's output cap per model, and
the client's own limit as the vendor will read it. Pure.

Two uses. Anthropic requires ``max_tokens`` and refuses one over the model's cap (``max_tokens:
N > M, which is the maximum allowed number of output tokens for MODEL``), so its translation
clamps to the cap and takes the thinking budget out of what is left (``anthropic/request.py``).
And every budget hold is computed from the most output a translated request lets the vendor
produce (``Dialect.max_output_tokens``, used by the Router before anything is sent): the
client's limit when the request carries one, else what the vendor then allows, which is the
model's cap.

The tables are looked up by prefix of the provider's ``model``, the first match winning (so
longer prefixes come first); dated ids (``claude-sonnet-4-5-20250929``), ``-latest`` aliases and
Vertex's ``@DATE`` forms match their family. A provider's ``max_output_tokens`` overrides them.
Sources (docs/providers.md#output-caps):

- Anthropic: https://docs.claude.com/en/docs/about-claude/models/overview ("Max output");
- OpenAI: https://platform.openai.com/docs/models (each model's "Max output tokens");
- Gemini: https://ai.google.dev/gemini-api/docs/models ("Output token limit").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from trio_gateway.config.schema import ProviderConfig

Caps = tuple[tuple[str, int], ...]

ANTHROPIC_OUTPUT_CAPS: Final[Caps] = (
    ("claude-opus-4-6", 128_000),
    ("claude-opus-4-5", 64_000),
    # Opus 4 and 4.1; a later Opus 4.x not listed gets the family's least.
    ("claude-opus-4", 32_000),
    ("claude-sonnet-4", 64_000),  # Sonnet 4, 4.5, 4.6
    ("claude-haiku-4", 64_000),  # Haiku 4.5
    ("claude-3-7-sonnet", 64_000),
    ("claude-3-5-sonnet", 8_192),
    ("claude-3-5-haiku", 8_192),
    ("claude-3-", 4_096),  # Claude 3 Opus, Sonnet, Haiku
)
# A model the table does not know: the least cap of any Claude model, so that what is sent is
# never refused; an operator raises it with the provider's ``max_output_tokens``.
ANTHROPIC_UNKNOWN_OUTPUT_CAP: Final = 4_096

OPENAI_OUTPUT_CAPS: Final[Caps] = (
    ("gpt-5-pro", 272_000),
    ("gpt-5", 128_000),
    ("gpt-4.1", 32_768),
    ("gpt-4o", 16_384),
    ("gpt-4-turbo", 4_096),
    ("gpt-3.5-turbo", 4_096),
    ("o1-mini", 65_536),
    ("o1-preview", 32_768),
    ("o1", 100_000),
    ("o3", 100_000),
    ("o4-mini", 100_000),
)
# Only a hold uses these (nothing is clamped): an unknown model is held at the largest cap.
OPENAI_UNKNOWN_OUTPUT_CAP: Final = 128_000

GEMINI_OUTPUT_CAPS: Final[Caps] = (
    ("gemini-2.0", 8_192),
    ("gemini-1.5", 8_192),
    ("gemini-2.5", 65_536),
    ("gemini-3", 65_536),
)
GEMINI_UNKNOWN_OUTPUT_CAP: Final = 65_536


def _lookup(model: str, caps: Caps) -> int | None:
    name = model.lower().removeprefix("models/")
    for prefix, cap in caps:
        if name.startswith(prefix):
            return cap
    return None


_TABLES: Final[Mapping[str, tuple[Caps, int]]] = {
    "anthropic": (ANTHROPIC_OUTPUT_CAPS, ANTHROPIC_UNKNOWN_OUTPUT_CAP),
    "openai": (OPENAI_OUTPUT_CAPS, OPENAI_UNKNOWN_OUTPUT_CAP),
    "gemini": (GEMINI_OUTPUT_CAPS, GEMINI_UNKNOWN_OUTPUT_CAP),
    "vertex": (GEMINI_OUTPUT_CAPS, GEMINI_UNKNOWN_OUTPUT_CAP),
}


def known_output_cap(provider: ProviderConfig) -> int | None:
    """``provider``'s model's output cap when it is known: the operator's ``max_output_tokens``,
    else the vendor's table. None: a model the table does not know (nothing to clamp to). The
    one table of output caps: the model families' rules (``*/model_rules.py``) read it too."""
    if provider.max_output_tokens is not None:
        return provider.max_output_tokens
    table = _TABLES.get(provider.type)
    return None if table is None else _lookup(provider.model, table[0])


def model_output_cap(provider: ProviderConfig) -> int:
    """The most output tokens ``provider``'s model produces per request (thinking included):
    :func:`known_output_cap`, else the vendor's default for an unknown model.
    ``openai_compatible`` has no table (the served model is the operator's):
    ``default_max_tokens`` stands in for it."""
    known = known_output_cap(provider)
    if known is not None:
        return known
    table = _TABLES.get(provider.type)
    return provider.default_max_tokens if table is None else table[1]


def client_output_limit(body: Mapping[str, Any], provider: ProviderConfig) -> int | None:
    """The client's ``max_completion_tokens``, else its ``max_tokens`` (as OpenAI reads them),
    as the provider will see them: a field in ``strip_fields`` is never sent. None: no limit."""
    strip = provider.strip_fields
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is not None and key not in strip:
            return int(value)
    return None


def held_output_tokens(body: Mapping[str, Any], provider: ProviderConfig) -> int:
    """The most output a vendor that passes the client's limit on (or sends none) may produce:
    that limit, else the model's cap (vLLM: its context, which the gateway does not know, so the
    provider's ``max_output_tokens`` or ``default_max_tokens``)."""
    limit = client_output_limit(body, provider)
    return limit if limit is not None else model_output_cap(provider)
