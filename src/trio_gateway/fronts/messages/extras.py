"""Anthropic's own fields in a Messages request, kept for an Anthropic provider. Pure.

No provider behind the chat shape but Anthropic takes ``cache_control`` breakpoints,
``context_management`` or ``anthropic-beta`` flags; the Messages front keeps them in the chat
body's gateway field :data:`~trio_gateway.core.request.ANTHROPIC_EXTRAS`, which the Anthropic
dialect merges into its request (``providers/anthropic/extras.py``) and every other dialect
never sends. A breakpoint is noted against the chat message (or tool) its block became: the
front joins a message's texts, so the dialect puts it on the last block it builds from that
message, which for a breakpoint on a message's last block (Claude Code's) is the same prefix.

Everything kept is bounded: breakpoints rebuilt from the two fields Anthropic has (at most
:data:`MAX_BREAKPOINTS`, Anthropic's own limit), ``context_management`` at most
:data:`MAX_CONTEXT_MANAGEMENT_BYTES` of JSON, beta flags by their shape and count.
"""

from __future__ import annotations

from typing import Any, Final

from trio_gateway.core.anthropic_extras import (
    MAX_BREAKPOINTS,
    SERVICE_TIERS,
    betas,
    cache_control,
    context_management,
)

Json = dict[str, Any]

# Anthropic's server tools (the vendor runs them) by type, as the header and the usage record
# name a dropped one; any other type is "other" (a client's own string never reaches either).
SERVER_TOOL_TYPES: Final = frozenset(
    {
        "web_search_20250305",
        "web_search_20260209",
        "web_fetch_20250910",
        "web_fetch_20260209",
        "code_execution_20250522",
        "code_execution_20250825",
        "bash_20241022",
        "bash_20250124",
        "text_editor_20241022",
        "text_editor_20250124",
        "text_editor_20250429",
        "text_editor_20250728",
        "computer_20241022",
        "computer_20250124",
        "computer_20251124",
        "memory_20250818",
        "tool_search_tool_regex_20251119",
        "tool_search_tool_bm25_20251119",
        "mcp_toolset",
    }
)


def block_breakpoint(block: Json) -> Json | None:
    return cache_control(block.get("cache_control")) if "cache_control" in block else None


class Extras:
    """Collects a request's extras as the front translates it."""

    def __init__(self) -> None:
        self.messages: list[list[Any]] = []  # [chat message index, cache_control]
        self.tools: list[list[Any]] = []  # [chat tool index, cache_control]
        self.fields: Json = {}
        self._breakpoints = 0

    def _room(self) -> bool:
        if self._breakpoints >= MAX_BREAKPOINTS:
            return False
        self._breakpoints += 1
        return True

    def mark_message(self, index: int, control: Json | None) -> None:
        if control is not None and not any(m[0] == index for m in self.messages) and self._room():
            self.messages.append([index, control])

    def mark_tool(self, index: int, control: Json | None) -> None:
        if control is not None and self._room():
            self.tools.append([index, control])

    def body(self) -> Json | None:
        """The gateway field's value; None when there is nothing to pass on."""
        out: Json = dict(self.fields)
        if self.messages:
            out["messages"] = self.messages
        if self.tools:
            out["tools"] = self.tools
        return out or None


def keep_fields(body: Json, extras: Extras, anthropic_beta: str | None) -> None:
    """Anthropic's own top-level fields and beta flags, for an Anthropic provider."""
    managed = context_management(body.get("context_management"))
    if managed is not None:
        extras.fields["context_management"] = managed
    if body.get("service_tier") in SERVICE_TIERS:
        extras.fields["service_tier"] = body["service_tier"]
    flags = betas(anthropic_beta)
    if flags:
        extras.fields["betas"] = flags


def kept_fields(kept: Json | None) -> frozenset[str]:
    """The client's top-level fields kept for Anthropic (not counted as dropped)."""
    return frozenset(k for k in kept or () if k in ("context_management", "service_tier"))
