"""The Messages front's Anthropic-only extras (the chat body's ``anthropic_extras``: see
``fronts/messages/extras.py``) merged into the Anthropic request. Pure.

Checked again here, whoever wrote them: a chat client may send the field too. A breakpoint
goes on the last block built from the chat message (or the tool) it names; the
``anthropic-beta`` flags go in the request's header."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from trio_gateway.core.anthropic_extras import (
    MAX_BETAS,
    MAX_BREAKPOINTS,
    SERVICE_TIERS,
    betas,
    cache_control,
    context_management,
)
from trio_gateway.core.request import ANTHROPIC_EXTRAS

Json = dict[str, Any]
BETA_HEADER: Final = "anthropic-beta"


@attrs.frozen
class AnthropicExtras:
    messages: Mapping[int, Json] = attrs.field(factory=dict)  # chat message index → breakpoint
    tools: Mapping[int, Json] = attrs.field(factory=dict)  # chat tool index → breakpoint
    fields: Mapping[str, Any] = attrs.field(factory=dict)  # top-level: context_management, ...
    betas: tuple[str, ...] = ()


def _marks(value: object, budget: list[int]) -> dict[int, Json]:
    out: dict[int, Json] = {}
    for mark in value if isinstance(value, list) else ():
        if not (isinstance(mark, list) and len(mark) == 2 and type(mark[0]) is int):
            continue
        control = cache_control(mark[1])
        if control is not None and mark[0] not in out and budget[0] > 0:
            budget[0] -= 1
            out[mark[0]] = control
    return out


def read_extras(body: Mapping[str, Any]) -> AnthropicExtras:
    extras = body.get(ANTHROPIC_EXTRAS)
    if not isinstance(extras, dict):
        return AnthropicExtras()
    budget = [MAX_BREAKPOINTS]
    tools = _marks(extras.get("tools"), budget)
    messages = _marks(extras.get("messages"), budget)
    fields: Json = {}
    managed = context_management(extras.get("context_management"))
    if managed is not None:
        fields["context_management"] = managed
    if extras.get("service_tier") in SERVICE_TIERS:
        fields["service_tier"] = extras["service_tier"]
    flags = extras.get("betas")
    text = ",".join(f for f in flags if isinstance(f, str)) if isinstance(flags, list) else ""
    return AnthropicExtras(
        messages=messages, tools=tools, fields=fields, betas=tuple(betas(text)[:MAX_BETAS])
    )


def mark_tools(tools: list[Json], extras: AnthropicExtras) -> None:
    for index, control in extras.tools.items():
        if 0 <= index < len(tools):
            tools[index]["cache_control"] = dict(control)


def extras_fields(extras: AnthropicExtras, *, thinking_on: bool) -> Json:
    """The top-level fields to send. Edits that clear thinking are left out of a request that
    does not think (the gateway may turn it off mid tool loop), where Anthropic refuses them."""
    fields = dict(extras.fields)
    managed = fields.get("context_management")
    if managed is not None and not thinking_on and isinstance(managed.get("edits"), list):
        edits = [
            e
            for e in managed["edits"]
            if not (isinstance(e, dict) and str(e.get("type", "")).startswith("clear_thinking"))
        ]
        if edits:
            fields["context_management"] = {**managed, "edits": edits}
        else:
            fields.pop("context_management")
    return fields


def beta_headers(body: Mapping[str, Any]) -> dict[str, str]:
    """The client's ``anthropic-beta`` flags, as the request's header."""
    flags = read_extras(body).betas
    return {BETA_HEADER: ",".join(flags)} if flags else {}
