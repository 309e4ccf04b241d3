"""The OpenAI wire's ``usage`` object, as every answer of it (chat, completions) reports it."""

from __future__ import annotations

from typing import Any

from trio_gateway.core.events import Usage


def _int_or_none(value: object) -> int | None:
    return value if type(value) is int else None


def parse_usage(usage: dict[str, Any]) -> Usage:
    completion_details = usage.get("completion_tokens_details") or {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")) or 0,
        completion_tokens=_int_or_none(usage.get("completion_tokens")) or 0,
        reasoning_tokens=_int_or_none(completion_details.get("reasoning_tokens")),
        cached_tokens=_int_or_none(prompt_details.get("cached_tokens")),
    )
