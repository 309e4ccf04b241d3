"""Gemini's thought signatures back from an OpenAI history. Pure.

Gemini signs the function calls (and sometimes the last part) of a thinking model's answer;
the signatures reach the client as the assistant message's ``reasoning_details``
(``reasoning.encrypted`` entries of format ``google-gemini-v1``, ``id`` the tool call), and a
client that sends the message back as it received it returns them. They are put back on the
parts they came on, untouched: Gemini 3 refuses a function call of the current turn without its
signature, and earlier models think on better with them.

A message without any Gemini entry (a history from before, or from another vendor) gets
Google's placeholder on every call, as before (:data:`request.SKIP_SIGNATURE`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from trio_gateway.core.reasoning_details import ENCRYPTED, GOOGLE, details_of


@attrs.frozen
class Signatures:
    calls: Mapping[str, str]  # tool call id → the signature its functionCall part carried
    text: str | None  # a signature on a part that called nothing (the last one)


def message_signatures(message: Mapping[str, Any]) -> Signatures | None:
    """An assistant message's Gemini signatures; None when it carries no Gemini entry."""
    entries = [e for e in details_of(message, GOOGLE) if e["type"] == ENCRYPTED]
    if not entries:
        return None
    calls: dict[str, str] = {}
    text = None
    for entry in entries:
        data = entry.get("data")
        if not data:
            continue
        call_id = entry.get("id")
        if call_id is None:
            text = data
        else:
            calls.setdefault(call_id, data)
    return Signatures(calls=calls, text=text)
