"""What the cloud vendors' models refuse, by the model name the simulator serves. Pure.

The vendors judge a request by its model, not by their API alone: gpt-5.1 refuses the
``reasoning_effort: "minimal"`` gpt-5 takes, and Gemini 2.5 Pro refuses the
``thinkingBudget: 0`` that turns 2.5 Flash's thinking off. The simulator answers as each model
does (the messages are the vendors' own, as their APIs word them), so a gateway that sends one
model's controls to another fails its tests the way it would fail in production. A served model
name of no family here (the default ``qwen3-32b``) is judged by the API's rules alone.

This table is the simulator's own, kept apart from the gateway's (``core/model_families.py``):
the tests compare the two, not one with itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

__all__ = [
    "GeminiRefusal",
    "OpenAIRefusal",
    "anthropic_refusal",
    "gemini_refusal",
    "gemini_thinks",
    "openai_default_effort",
    "openai_refusal",
]

_TEMPERATURE_ONLY_DEFAULT: Final = ("temperature", "top_p")
_O_SERIES_UNSUPPORTED: Final = ("presence_penalty", "frequency_penalty", "logit_bias")


@attrs.frozen
class _OpenAIModel:
    # reasoning_effort values taken; None: "Unsupported parameter: 'reasoning_effort'".
    efforts: tuple[str, ...] | None
    default_effort: str | None
    max_output_tokens: int
    # temperature and top_p: only the default (1); at effort "none" too unless `at_none`.
    sampling_default_only: bool = False
    sampling_at_none: bool = False
    # o-series: penalties and logit_bias are not supported at all.
    unsupported: tuple[str, ...] = ()
    # gpt-5.1 and later name themselves when refusing an effort.
    names_itself: bool = False


_O_SERIES = _OpenAIModel(
    ("low", "medium", "high"),
    "medium",
    100_000,
    sampling_default_only=True,
    unsupported=_O_SERIES_UNSUPPORTED,
)
_OPENAI: Final[Mapping[str, _OpenAIModel]] = {
    "o1": _O_SERIES,
    "o3": _O_SERIES,
    "o3-mini": _O_SERIES,
    "o4-mini": _O_SERIES,
    "gpt-5": _OpenAIModel(
        ("minimal", "low", "medium", "high"), "medium", 128_000, sampling_default_only=True
    ),
    "gpt-5-pro": _OpenAIModel(("high",), "high", 272_000, sampling_default_only=True),
    "gpt-5.1": _OpenAIModel(
        ("none", "low", "medium", "high"),
        "none",
        128_000,
        sampling_default_only=True,
        sampling_at_none=True,
        names_itself=True,
    ),
    "gpt-5.2": _OpenAIModel(
        ("none", "low", "medium", "high", "xhigh"),
        "none",
        128_000,
        sampling_default_only=True,
        sampling_at_none=True,
        names_itself=True,
    ),
    "gpt-4o": _OpenAIModel(None, None, 16_384),
    "gpt-4.1": _OpenAIModel(None, None, 32_768),
}


@attrs.frozen
class _GeminiModel:
    # The thinkingBudget range when thinking; None: any positive budget (Gemini 3 takes one
    # for compatibility, but levels are its own).
    budget: tuple[int, int] | None
    budget_off: bool  # a budget of 0 turns thinking off
    levels: tuple[str, ...] = ()


_GEMINI: Final[Mapping[str, _GeminiModel]] = {
    "gemini-2.5-pro": _GeminiModel((128, 32_768), budget_off=False),
    "gemini-2.5-flash": _GeminiModel((1, 24_576), budget_off=True),
    "gemini-2.5-flash-lite": _GeminiModel((512, 24_576), budget_off=True),
    "gemini-3-pro": _GeminiModel(None, budget_off=False, levels=("LOW", "HIGH")),
    "gemini-3-flash": _GeminiModel(
        None, budget_off=False, levels=("MINIMAL", "LOW", "MEDIUM", "HIGH")
    ),
}


def _family(model: str, names: Iterable[str]) -> str | None:
    fits = [n for n in names if model == n or model.startswith(n + "-")]
    return max(fits, key=len, default=None)


def _quoted(values: tuple[str, ...]) -> str:
    quoted = [f"'{v}'" for v in values]
    if len(quoted) <= 2:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


@attrs.frozen
class OpenAIRefusal:
    message: str
    param: str
    code: str


def openai_default_effort(model: str) -> str:
    """The effort the model reasons at when none is sent: ``none`` for a model that does not
    reason, ``medium`` (the simulator's scripted model thinks) for a name unknown here."""
    family = _family(model, _OPENAI)
    if family is None:
        return "medium"
    return _OPENAI[family].default_effort or "none"


def openai_refusal(model: str, data: Mapping[str, Any]) -> OpenAIRefusal | None:
    """OpenAI's 400 for a Chat Completions body its model ``model`` refuses; None if taken."""
    family = _family(model, _OPENAI)
    if family is None:
        return None
    rules = _OPENAI[family]
    effort = data.get("reasoning_effort")
    if effort is not None:
        if rules.efforts is None:
            return OpenAIRefusal(
                "Unsupported parameter: 'reasoning_effort' is not supported with this model.",
                "reasoning_effort",
                "unsupported_parameter",
            )
        if effort not in rules.efforts:
            supported = f"Supported values are: {_quoted(rules.efforts)}."
            if rules.names_itself:
                said = f"Unsupported value: '{effort}' is not supported with the '{family}' model."
            else:
                said = (
                    f"Unsupported value: 'reasoning_effort' does not support '{effort}' with "
                    "this model."
                )
            return OpenAIRefusal(f"{said} {supported}", "reasoning_effort", "unsupported_value")
    for name in rules.unsupported:
        if data.get(name) is not None:
            return OpenAIRefusal(
                f"Unsupported parameter: '{name}' is not supported with this model.",
                name,
                "unsupported_parameter",
            )
    at_none = (effort or rules.default_effort) == "none"
    if rules.sampling_default_only and not (rules.sampling_at_none and at_none):
        for name in _TEMPERATURE_ONLY_DEFAULT:
            value = data.get(name)
            if value is not None and value != 1:
                return OpenAIRefusal(
                    f"Unsupported value: '{name}' does not support {value} with this model. "
                    "Only the default (1) value is supported.",
                    name,
                    "unsupported_value",
                )
    limit = data.get("max_completion_tokens") or data.get("max_tokens")
    if type(limit) is int and limit > rules.max_output_tokens:
        return OpenAIRefusal(
            f"max_tokens is too large: {limit}. This model supports at most "
            f"{rules.max_output_tokens} completion tokens, whereas you provided {limit}.",
            "max_tokens",
            "invalid_value",
        )
    return None


@attrs.frozen
class GeminiRefusal:
    message: str


def gemini_refusal(model: str, thinking: Mapping[str, Any]) -> GeminiRefusal | None:
    """Gemini's 400 for a ``thinkingConfig`` its model ``model`` refuses; None if taken."""
    family = _family(model, _GEMINI)
    if family is None:
        return None
    rules = _GEMINI[family]
    level = thinking.get("thinkingLevel")
    if level is not None:
        if not rules.levels:
            return GeminiRefusal("Thinking level is not supported for this model.")
        if str(level).upper() not in rules.levels:
            return GeminiRefusal(
                f"Thinking level {str(level).upper()} is not supported for this model."
            )
    budget = thinking.get("thinkingBudget")
    if budget is None or budget == -1:
        return None
    if budget == 0:
        if rules.budget_off:
            return None
        return GeminiRefusal("Budget 0 is invalid. This model only works in thinking mode.")
    if rules.budget is not None:
        low, high = rules.budget
        if not low <= budget <= high:
            return GeminiRefusal(
                f"The thinking budget {budget} is invalid. Please choose a value between "
                f"{low} and {high}."
            )
    return None


def gemini_thinks(thinking: Mapping[str, Any]) -> bool:
    """Whether the model thinks under ``thinkingConfig`` (taken): 2.5-class models think
    unless their budget is 0; Gemini 3 at its ``MINIMAL`` level hardly does, shown as not."""
    if thinking.get("thinkingBudget") == 0:
        return False
    return str(thinking.get("thinkingLevel", "")).upper() != "MINIMAL"


# Anthropic's models that take `temperature` or `top_p`, never both.
_ANTHROPIC_ONE_OF_SAMPLING: Final = frozenset(
    {"claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-5"}
)


def anthropic_refusal(model: str, data: Mapping[str, Any]) -> str | None:
    """Anthropic's 400 message for a Messages body its model ``model`` refuses; None if taken."""
    one_of = _family(model, _ANTHROPIC_ONE_OF_SAMPLING) is not None
    if one_of and data.get("temperature") is not None and data.get("top_p") is not None:
        return (
            "`temperature` and `top_p` cannot both be specified for this model. Please use "
            "only one."
        )
    return None
