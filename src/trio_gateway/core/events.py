"""The gateway's internal event vocabulary.

Providers turn their wire streams into these; fronts (OpenAI chunks, the SSE event stream, the
WebSocket) encode them. Nothing here knows a provider or a front.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(slots=True)
class ResponseStarted:
    provider: str


@attrs.frozen(slots=True)
class ReasoningDelta:
    text: str


@attrs.frozen(slots=True)
class ReasoningDetail:
    """A piece of the answer's reasoning its vendor needs back to go on thinking (a signed
    thinking block, a redacted one, a thought signature), whole: see
    ``core/reasoning_details.py``. ``text`` and ``signature`` for readable thinking; ``data``
    for an opaque one; ``tool_call_id`` the call a signature belongs to."""

    index: int
    format: str
    text: str | None = None
    signature: str | None = None
    data: str | None = None
    tool_call_id: str | None = None


@attrs.frozen(slots=True)
class TextDelta:
    text: str


@attrs.frozen(slots=True)
class ToolCallDelta:
    index: int
    id: str | None
    name: str | None
    arguments: str


@attrs.frozen(slots=True)
class ToolCallDone:
    index: int
    id: str
    name: str
    arguments: Any  # parsed JSON when arguments_valid, else the raw string
    arguments_raw: str
    arguments_valid: bool


@attrs.frozen(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen(slots=True)
class ResponseDone:
    finish_reason: str
    # The client's stop sequence that ended the answer, where the vendor says which (vLLM's
    # stop_reason, Anthropic's stop_sequence): Anthropic's clients are told it.
    stop_sequence: str | None = None


@attrs.frozen(slots=True)
class CompletionText:
    """A piece of one choice of a text completion (``/v1/completions``): ``index`` tells the
    choices apart (one per prompt and ``n``); ``finish_reason`` ends that choice."""

    index: int
    text: str
    finish_reason: str | None = None


@attrs.frozen(slots=True)
class Embeddings:
    """An embeddings answer (``/v1/embeddings``), one vector per input in the inputs' order,
    each as the vendor sent it: a list of floats, or base64 text of float32s."""

    vectors: tuple[list[float] | str, ...]


@attrs.frozen(slots=True)
class ResponseCancelled:
    reason: str


@attrs.frozen(slots=True)
class ErrorEvent:
    code: str
    message: str
    retryable: bool
    retry_after_s: float | None = None
    provider: str | None = None


Event = (
    ResponseStarted
    | ReasoningDelta
    | ReasoningDetail
    | TextDelta
    | ToolCallDelta
    | ToolCallDone
    | Usage
    | ResponseDone
    | ResponseCancelled
    | ErrorEvent
    | CompletionText
    | Embeddings
)

# The answers of /v1/completions and /v1/embeddings alone: never on the gateway's own event
# stream (/v1/events and /v1/ws take chat requests only), so it has no wire form for them.
ENDPOINT_ONLY_EVENTS: tuple[type, ...] = (CompletionText, Embeddings)
