"""Anthropic's thinking blocks back from an OpenAI history. Pure.

An answer's ``thinking`` and ``redacted_thinking`` blocks reach the client as the assistant
message's ``reasoning_details`` (``core/reasoning_details.py``); a client that sends the message
back as it received it returns them, and they are put back where Anthropic wants them: first in
the assistant turn, in their order, text, signature and data untouched. With them, thinking stays
on in a tool loop (Anthropic wants the turn that called the tools to open with its signed
thinking); without them, the request cannot think there, as before.

Entries of another vendor's ``format``, unsigned thinking (which Anthropic would refuse) and
summaries are not sent. The blocks are sent only when this request thinks: a request without
thinking gets the history as it would have been without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from trio_gateway.core.reasoning_details import ANTHROPIC, ENCRYPTED, TEXT, details_of

Block = dict[str, Any]

THINKING_BLOCKS: Final = frozenset({"thinking", "redacted_thinking"})


def thinking_blocks(message: Mapping[str, Any]) -> list[Block]:
    """An assistant message's Anthropic reasoning details as the blocks Anthropic sent."""
    blocks: list[Block] = []
    for entry in details_of(message, ANTHROPIC):
        if entry["type"] == TEXT:
            signature = entry.get("signature")
            if signature:
                text = entry.get("text") or ""
                blocks.append({"type": "thinking", "thinking": text, "signature": signature})
        elif entry["type"] == ENCRYPTED and entry.get("data"):
            blocks.append({"type": "redacted_thinking", "data": entry["data"]})
    return blocks


def resumes_thinking(turns: list[Block]) -> bool:
    """The last assistant turn opens with its thinking: Anthropic lets such a tool loop think."""
    for turn in reversed(turns):
        if turn["role"] == "assistant":
            return bool(turn["content"]) and turn["content"][0]["type"] in THINKING_BLOCKS
    return False


def without_thinking(turns: list[Block]) -> list[Block]:
    """``turns`` without the thinking blocks put back (a request that does not think). A turn
    is never left empty: the blocks only ever stand before others."""
    out = []
    for turn in turns:
        if turn["role"] == "assistant" and any(
            block["type"] in THINKING_BLOCKS for block in turn["content"]
        ):
            content = [block for block in turn["content"] if block["type"] not in THINKING_BLOCKS]
            turn = {"role": "assistant", "content": content}
        out.append(turn)
    return out
