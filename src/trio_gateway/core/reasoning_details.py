"""``reasoning_details``: what a vendor needs back to go on thinking, on OpenAI's wire. Pure.

Anthropic signs its thinking blocks and Gemini its function calls; a tool loop that sends an
answer back without them loses the model's thinking (Anthropic refuses thinking mid loop
without the signed block; Gemini 3 refuses a function call without its signature). OpenAI's
chat shape has no place for them, so the gateway follows OpenRouter's convention, which agent
clients already carry: an assistant message's ``reasoning_details`` array, each entry

- ``{"type": "reasoning.text", "text", "signature", "format", "index"}``: an Anthropic
  ``thinking`` block (its text and signature);
- ``{"type": "reasoning.encrypted", "data", "format", "index", "id"?}``: an Anthropic
  ``redacted_thinking`` block (``data``), or a Gemini ``thoughtSignature`` (``data``), with
  ``id`` the tool call it was sent on (none: a signature on a text part).

``format`` names the vendor (:data:`ANTHROPIC`, :data:`GOOGLE`): a provider sends back only
the entries of its own format, so a history that went through another vendor is still valid.
The same entries arrive in the stream as ``delta.reasoning_details``, each whole, once: a client
appends them, in order, to the message it sends back (docs/api.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from trio_gateway.core.events import ReasoningDetail
from trio_gateway.core.validation_values import (
    array,
    enum_value,
    json_object,
    number,
    optional_fields,
    required,
    string,
)

ANTHROPIC: Final = "anthropic-claude-v1"
GOOGLE: Final = "google-gemini-v1"
TEXT: Final = "reasoning.text"
ENCRYPTED: Final = "reasoning.encrypted"
SUMMARY: Final = "reasoning.summary"  # OpenRouter's third kind: accepted, never sent upstream
TYPES: Final = (TEXT, ENCRYPTED, SUMMARY)
# Entries on one assistant message: far more blocks than any answer holds (one per thinking
# block, one per signed call), and a bound on what one message makes the gateway copy.
MAX_DETAILS: Final = 256

_ENTRY_FIELDS: Final = {
    "text": string,
    "signature": string,
    "data": string,
    "summary": string,
    "id": string,
    "format": string,
    "index": number("integer", 0),
}


def detail_object(detail: ReasoningDetail) -> dict[str, Any]:
    """The wire entry of one :class:`ReasoningDetail` (the chunks', the whole answer's and the
    event stream's)."""
    out: dict[str, Any]
    if detail.data is None:
        out = {"type": TEXT, "text": detail.text or "", "signature": detail.signature}
    else:
        out = {"type": ENCRYPTED, "data": detail.data}
    if detail.tool_call_id is not None:
        out["id"] = detail.tool_call_id
    out["format"] = detail.format
    out["index"] = detail.index
    return out


def check_details(path: str, value: object) -> None:
    """An assistant message's ``reasoning_details``, as the request may carry them: an array of
    objects with a known ``type`` and string fields. Other keys are left alone (clients echo
    what OpenRouter-shaped answers hold); what is sent on is built from the known ones."""
    for i, item in enumerate(array(path, value, max_items=MAX_DETAILS)):
        entry_path = f"{path}[{i}]"
        entry = json_object(entry_path, item)
        enum_value(f"{entry_path}.type", required(entry, "type", entry_path), TYPES)
        optional_fields(entry_path, entry, _ENTRY_FIELDS)


def details_of(message: Mapping[str, Any], format: str) -> Iterator[Mapping[str, Any]]:
    """A validated message's entries of one ``format``, in the order the client gave them."""
    for entry in message.get("reasoning_details") or ():
        if entry.get("format") == format:
            yield entry
