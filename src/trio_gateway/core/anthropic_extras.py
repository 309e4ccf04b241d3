"""Anthropic's own request fields the gateway passes on to Anthropic alone, checked and
bounded: read by the Messages front from a client's request, and again by the Anthropic
dialect from the chat body's ``anthropic_extras`` (which a chat client may send too). Pure."""

from __future__ import annotations

import json
import re
from typing import Any, Final

Json = dict[str, Any]

# Anthropic refuses a request with more than four cache_control blocks.
MAX_BREAKPOINTS: Final = 4
CACHE_TTLS: Final = ("5m", "1h")
MAX_CONTEXT_MANAGEMENT_BYTES: Final = 16_384
MAX_BETAS: Final = 16
_BETA: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
SERVICE_TIERS: Final = ("auto", "standard_only")


def cache_control(value: object) -> Json | None:
    """A block's ``cache_control`` as Anthropic takes it; None for none, or one of a shape
    Anthropic does not have (dropped: the answer is the same without a cache)."""
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        return None
    out: Json = {"type": "ephemeral"}
    if value.get("ttl") in CACHE_TTLS:
        out["ttl"] = value["ttl"]
    return out


def context_management(value: object) -> Json | None:
    """``context_management`` as the client sent it, if it is an object of bounded size."""
    if not isinstance(value, dict):
        return None
    if len(json.dumps(value, ensure_ascii=False)) > MAX_CONTEXT_MANAGEMENT_BYTES:
        return None
    return value


def betas(header: str | None) -> list[str]:
    """The client's ``anthropic-beta`` flags (comma-separated), each of a flag's shape."""
    if not header:
        return []
    flags = [flag.strip() for flag in header.split(",")]
    return [flag for flag in flags if _BETA.fullmatch(flag)][:MAX_BETAS]
