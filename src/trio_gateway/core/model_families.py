"""What each cloud vendor's model families take, from the vendors' own pages. Pure data.

Reasoning controls and the sampling fields a model refuses differ per model, not per vendor
(output caps too, held in ``providers/output_caps.py``): ``reasoning_effort: "minimal"`` is
what turns gpt-5 down and a 400 from gpt-5.1; ``thinkingBudget: 0`` turns 2.5 Flash off and is
a 400 from 2.5 Pro. The dialects read these
tables to send each model what it takes (docs/providers.md, "Model families", has them as a
table with each row's source), and config checks a provider's ``model_family`` against them.

A provider's family is its ``model_family`` from config when given, else the family whose name
is the longest prefix of its ``model`` ending at the end of the name or before ``-``, ``:`` or
``@`` (``gpt-5.1-2025-11-13`` is gpt-5.1, ``gpt-5-mini`` is gpt-5, ``gemini-2.5-pro-preview-06-05``
is gemini-2.5-pro). A model of no known family gets the safe default: the dialect sends nothing
of its own that the vendor may refuse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final, TypeVar

import attrs

# OpenAI's effort scale, least first (docs/api.md: the values a client may send).
EFFORT_ORDER: Final = ("none", "minimal", "low", "medium", "high", "xhigh")
_RANK: Final = {effort: i for i, effort in enumerate(EFFORT_ORDER)}
_BOUNDARIES: Final = ("-", ":", "@")

OPENAI_EFFORT_PAGE: Final = (
    "https://platform.openai.com/docs/api-reference/chat/create#chat-create-reasoning_effort"
)
OPENAI_REASONING_PAGE: Final = "https://platform.openai.com/docs/guides/reasoning"
OPENAI_GPT5_PAGE: Final = "https://platform.openai.com/docs/guides/latest-model"
GEMINI_THINKING_PAGE: Final = "https://ai.google.dev/gemini-api/docs/thinking"
GEMINI_MODELS_PAGE: Final = "https://ai.google.dev/gemini-api/docs/models"
ANTHROPIC_MODELS_PAGE: Final = "https://docs.claude.com/en/docs/about-claude/models/overview"
ANTHROPIC_MIGRATION_PAGE: Final = (
    "https://docs.claude.com/en/docs/about-claude/models/migrating-to-claude-4"
)

# The o-series' limits: "temperature, top_p and n are fixed at 1, presence_penalty and
# frequency_penalty at 0"; logprobs and logit_bias are not supported.
_O_SERIES_REFUSED: Final = frozenset(
    {
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "top_logprobs",
        "logit_bias",
    }
)
# GPT-5 and later: "temperature, top_p, logprobs ... only supported when using reasoning effort
# none"; gpt-5 (which has no "none") refuses them always.
_GPT5_REFUSED: Final = frozenset({"temperature", "top_p", "logprobs", "top_logprobs"})


@attrs.frozen(kw_only=True)
class OpenAIFamily:
    name: str
    # The reasoning_effort values the model takes, least first; () when it refuses the field.
    efforts: tuple[str, ...]
    # The effort that turns reasoning off, or down to its least; None: it cannot be turned off.
    off: str | None
    # What the model does when no effort is sent (None: it does not reason).
    default_effort: str | None
    # Sampling fields the model refuses (at any value but their default): never sent to it...
    refused_sampling: frozenset[str] = frozenset()
    # ... unless its effort is "none" (gpt-5.1 and later take them there).
    sampling_at_effort_none: bool = False
    source: str


@attrs.frozen(kw_only=True)
class GeminiFamily:
    name: str
    thinks: bool
    # 2.5-class: the thinkingBudget range the model takes when thinking (-1, dynamic, too).
    budget: tuple[int, int] | None = None
    # Gemini 3: the thinkingLevel values it takes, least first (a thinkingBudget is for 2.5).
    levels: tuple[str, ...] = ()
    # What turns thinking off, or down to its least: a budget (0) or a level ("MINIMAL");
    # None: it cannot be turned off ("This model only works in thinking mode").
    off: int | str | None = None
    source: str


@attrs.frozen(kw_only=True)
class AnthropicFamily:
    name: str
    # "`temperature` and `top_p` cannot both be specified for this model."
    one_of_temperature_top_p: bool = False
    source: str


Family = TypeVar("Family", OpenAIFamily, GeminiFamily, AnthropicFamily)


def _by_name(*families: Family) -> Mapping[str, Family]:
    return MappingProxyType({f.name: f for f in families})


def _o_series(name: str) -> OpenAIFamily:
    return OpenAIFamily(
        name=name,
        efforts=("low", "medium", "high"),
        off=None,
        default_effort="medium",
        refused_sampling=_O_SERIES_REFUSED,
        source=OPENAI_REASONING_PAGE,
    )


OPENAI: Final = _by_name(
    _o_series("o1"),
    _o_series("o3"),
    _o_series("o3-mini"),
    _o_series("o4-mini"),
    # The first o1s took no reasoning_effort at all.
    OpenAIFamily(
        name="o1-mini",
        efforts=(),
        off=None,
        default_effort="medium",
        refused_sampling=_O_SERIES_REFUSED,
        source=OPENAI_REASONING_PAGE,
    ),
    OpenAIFamily(
        name="gpt-5",
        efforts=("minimal", "low", "medium", "high"),
        off="minimal",
        default_effort="medium",
        refused_sampling=_GPT5_REFUSED,
        source=OPENAI_EFFORT_PAGE,
    ),
    OpenAIFamily(
        name="gpt-5-pro",
        efforts=("high",),
        off=None,
        default_effort="high",
        refused_sampling=_GPT5_REFUSED,
        source=OPENAI_EFFORT_PAGE,
    ),
    OpenAIFamily(
        name="gpt-5-chat",
        efforts=(),
        off=None,
        default_effort=None,
        source=OPENAI_EFFORT_PAGE,
    ),
    OpenAIFamily(
        name="gpt-5.1",
        efforts=("none", "low", "medium", "high"),
        off="none",
        default_effort="none",
        refused_sampling=_GPT5_REFUSED,
        sampling_at_effort_none=True,
        source=OPENAI_EFFORT_PAGE,
    ),
    OpenAIFamily(
        name="gpt-5.1-chat",
        efforts=("medium",),
        off=None,
        default_effort="medium",
        refused_sampling=_GPT5_REFUSED,
        source=OPENAI_GPT5_PAGE,
    ),
    OpenAIFamily(
        name="gpt-5.2",
        efforts=("none", "low", "medium", "high", "xhigh"),
        off="none",
        default_effort="none",
        refused_sampling=_GPT5_REFUSED,
        sampling_at_effort_none=True,
        source=OPENAI_GPT5_PAGE,
    ),
    OpenAIFamily(
        name="gpt-5.2-pro",
        efforts=("medium", "high", "xhigh"),
        off=None,
        default_effort="medium",
        refused_sampling=_GPT5_REFUSED,
        source=OPENAI_GPT5_PAGE,
    ),
    # Models that do not reason: "Unsupported parameter: 'reasoning_effort'".
    OpenAIFamily(
        name="gpt-4.1",
        efforts=(),
        off=None,
        default_effort=None,
        source="https://platform.openai.com/docs/models/gpt-4.1",
    ),
    OpenAIFamily(
        name="gpt-4o",
        efforts=(),
        off=None,
        default_effort=None,
        source="https://platform.openai.com/docs/models/gpt-4o",
    ),
)

GEMINI: Final = _by_name(
    GeminiFamily(
        name="gemini-2.5-pro",
        thinks=True,
        budget=(128, 32_768),
        off=None,
        source=GEMINI_THINKING_PAGE,
    ),
    GeminiFamily(
        name="gemini-2.5-flash",
        thinks=True,
        budget=(1, 24_576),
        off=0,
        source=GEMINI_THINKING_PAGE,
    ),
    GeminiFamily(
        name="gemini-2.5-flash-lite",
        thinks=True,
        budget=(512, 24_576),
        off=0,
        source=GEMINI_THINKING_PAGE,
    ),
    GeminiFamily(
        name="gemini-3-pro",
        thinks=True,
        levels=("LOW", "HIGH"),
        off=None,
        source=GEMINI_THINKING_PAGE,
    ),
    GeminiFamily(
        name="gemini-3-flash",
        thinks=True,
        levels=("MINIMAL", "LOW", "MEDIUM", "HIGH"),
        off="MINIMAL",
        source=GEMINI_THINKING_PAGE,
    ),
    GeminiFamily(
        name="gemini-2.0-flash",
        thinks=False,
        source=GEMINI_MODELS_PAGE,
    ),
    GeminiFamily(
        name="gemini-2.0-flash-lite",
        thinks=False,
        source=GEMINI_MODELS_PAGE,
    ),
)

ANTHROPIC: Final = _by_name(
    AnthropicFamily(
        name="claude-opus-4-5",
        one_of_temperature_top_p=True,
        source=ANTHROPIC_MODELS_PAGE,
    ),
    AnthropicFamily(name="claude-opus-4-1", source=ANTHROPIC_MODELS_PAGE),
    AnthropicFamily(name="claude-opus-4", source=ANTHROPIC_MODELS_PAGE),
    AnthropicFamily(
        name="claude-sonnet-4-5",
        one_of_temperature_top_p=True,
        source=ANTHROPIC_MIGRATION_PAGE,
    ),
    AnthropicFamily(name="claude-sonnet-4", source=ANTHROPIC_MODELS_PAGE),
    AnthropicFamily(
        name="claude-haiku-4-5",
        one_of_temperature_top_p=True,
        source=ANTHROPIC_MIGRATION_PAGE,
    ),
    AnthropicFamily(name="claude-3-7-sonnet", source=ANTHROPIC_MODELS_PAGE),
    AnthropicFamily(name="claude-3-5-haiku", source=ANTHROPIC_MODELS_PAGE),
)

# The table each provider type reads (openai_compatible has none: vLLM serves any model).
TABLES: Final[Mapping[str, Mapping[str, OpenAIFamily | GeminiFamily | AnthropicFamily]]] = (
    MappingProxyType({"openai": OPENAI, "gemini": GEMINI, "vertex": GEMINI, "anthropic": ANTHROPIC})
)


def match_family(model: str, names: Iterable[str]) -> str | None:
    """The family ``model`` belongs to: the longest of ``names`` that is ``model`` or its
    prefix followed by ``-``, ``:`` or ``@``; None when none is."""
    # Google's resource names ("models/gemini-2.5-pro") name the same model.
    model = model.rpartition("/")[2]
    best: str | None = None
    for name in names:
        fits = model == name or (model.startswith(name) and model[len(name)] in _BOUNDARIES)
        if fits and (best is None or len(name) > len(best)):
            best = name
    return best


def _family(table: Mapping[str, Family], model: str, override: str | None) -> Family | None:
    if override is not None:
        return table.get(override)
    name = match_family(model, table)
    return None if name is None else table[name]


def openai_family(model: str, override: str | None = None) -> OpenAIFamily | None:
    return _family(OPENAI, model, override)


def gemini_family(model: str, override: str | None = None) -> GeminiFamily | None:
    return _family(GEMINI, model, override)


def anthropic_family(model: str, override: str | None = None) -> AnthropicFamily | None:
    return _family(ANTHROPIC, model, override)


def nearest_effort(wanted: str, accepted: tuple[str, ...]) -> str:
    """The accepted effort closest to ``wanted`` on OpenAI's scale, the higher one on a tie
    (asked for ``medium`` of a model with ``low`` and ``high``: ``high``)."""
    target = _RANK.get(wanted, _RANK["medium"])

    def distance(effort: str) -> tuple[int, int]:
        rank = _RANK.get(effort.lower(), 0)
        return abs(rank - target), -rank

    return min(accepted, key=distance)
