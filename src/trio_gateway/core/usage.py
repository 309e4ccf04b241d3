"""One usage record per request, whichever front served it and however it ended. Pure.

::

    parser (per chunk: keeps the latest cumulative counts, a plain assignment)
      │ the answer ends ............ Usage event ──────────────▶ Outcome.usage
      │ the stream is cut .......... the shell asks usage_so_far() once ─▶ UsageMeter
      ▼
    relay.record ──▶ usage_record(...) ──▶ UsageSink.offer (never blocks; ledger.py)

Requests refused before an answer began (invalid JSON, unknown model, validation, overloaded, a
refused key) get a ``refused`` record with zero tokens (:func:`refused_record`).

``estimated`` is true when the counts are not the vendor's own: a stream cut before the vendor
sent cumulative counts covering everything it streamed. Then the completion is counted from what
was streamed (:func:`estimate_tokens`: one token per chunk for OpenAI-style streams, which send
one token per chunk; characters / 4 elsewhere) and a prompt the vendor never reported is
estimated from the request's messages (:func:`estimate_prompt_tokens`: its text the same way,
its media by the vendor's rules).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Literal, Protocol

import attrs

from trio_gateway.core.events import Usage
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.media_tokens import VENDORS, split_media, vendor_tokens, vendors_of

Outcome = Literal["completed", "failed", "cancelled", "refused"]
OUTCOMES: tuple[str, ...] = ("completed", "failed", "cancelled", "refused")
# The usual rule of thumb for English text with BPE vocabularies.
CHARS_PER_TOKEN = 4
# Error codes the gateway itself answers before asking any provider: a refusal, not a failure.
REFUSAL_CODES = frozenset({"overloaded", "shutting_down"})


def estimate_tokens(chars: int) -> int:
    """``chars`` of streamed text → tokens, rounded up (any text is at least one token)."""
    return -(-chars // CHARS_PER_TOKEN)


@attrs.frozen(slots=True)
class PartialUsage:
    """The usage of an answer so far, as a parser knows it when its stream is cut."""

    usage: Usage
    estimated: bool


@attrs.define(slots=True)
class UsageMeter:
    """Where the provider shell leaves the parser's usage when an attempt's stream ends (cut or
    not): read once per attempt, never per chunk. The last attempt's wins."""

    partial: PartialUsage | None = None


@attrs.frozen(kw_only=True)
class UsageRecord:
    request_id: str
    key: str | None
    alias: str | None
    provider: str | None
    outcome: Outcome
    error_code: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    estimated: bool = False
    ttft_s: float | None = None
    duration_s: float = 0.0
    started_at: float  # wall clock, seconds since the epoch
    # The endpoint it came to: a ``RequestKind`` value (chat, completions, embeddings) or the
    # front that translated it into chat (messages, responses).
    endpoint: str = "chat"
    # The output filters that acted on the answer, as "name:action" joined by commas (an
    # input filter's refusal is error_code content_filtered, with no answer to note).
    filtered: str | None = None
    # The priority class it was served with (key, alias, x-priority: core/priority.py); None
    # for a request refused before its class was known.
    priority: int | None = None
    # The built-in tools an agent front dropped from the request, by type, joined by commas.
    dropped_tools: str | None = None
    # What it cost, in nanos (1e-9 of the prices' unit: accounting/limits.py), at the prices the
    # answering provider had when the request was admitted; 0 when nothing answered or is priced.
    cost_nanos: int = 0

    def as_row(self) -> dict[str, object]:
        return attrs.asdict(self)


class UsageSink(Protocol):
    """Where records go (chosen in config: the SQLite ledger, or nowhere)."""

    def offer(self, record: UsageRecord) -> bool:
        """Take ``record`` without ever blocking; False if it had to be dropped."""
        ...


@attrs.frozen
class NullSink:
    """``[usage] ledger = "none"``: records are made and dropped."""

    def offer(self, record: UsageRecord) -> bool:
        return True


NULL_SINK = NullSink()


def estimate_prompt_tokens(messages: object, provider_types: Iterable[str | None] = (None,)) -> int:
    """A prompt the vendor has not counted: at admission (before any provider is chosen), and
    for a cut stream of a vendor without early usage.

    Text is characters / 4 (as JSON: roles and keys count too); each image, audio clip and file
    is counted by its vendor's rule (``media_tokens.py``), never by its base64. Given several
    provider types, the most any of them would count (docs/accounting.md, "The prompt
    estimate")."""
    if not messages:
        return 0
    if not isinstance(messages, list):
        return estimate_tokens(len(json.dumps(messages, ensure_ascii=False)))
    text, media = split_media(messages)
    tokens = estimate_tokens(len(json.dumps(text, ensure_ascii=False)))
    if media:
        vendors = {v for kind in provider_types for v in vendors_of(kind)} or set(VENDORS)
        tokens += max(sum(vendor_tokens(m, vendor) for m in media) for vendor in vendors)
    return tokens


def estimate_input_tokens(value: object) -> int:
    """A completions ``prompt`` or an embeddings ``input``, as validated: a text, texts, token
    ids, or lists of token ids. A token id is one token; a text is estimated by its length."""
    if isinstance(value, str):
        return estimate_tokens(len(value))
    if not isinstance(value, list):
        return 0
    total = 0
    for item in value:
        if isinstance(item, str):
            total += estimate_tokens(len(item))
        elif isinstance(item, list):
            total += len(item)
        else:
            total += 1  # a token id
    return total


def estimate_body_prompt(
    body: Mapping[str, object],
    kind: RequestKind,
    provider_types: Iterable[str | None] = (None,),
) -> int:
    """The prompt of a request body of ``kind``, estimated (media by the rules of
    ``provider_types``' vendors, as :func:`estimate_prompt_tokens`)."""
    if kind is RequestKind.COMPLETIONS:
        return estimate_input_tokens(body.get("prompt"))
    if kind is RequestKind.EMBEDDINGS:
        return estimate_input_tokens(body.get("input"))
    return estimate_prompt_tokens(body.get("messages"), provider_types)


def usage_record(
    *,
    request_id: str,
    key: str | None,
    alias: str,
    provider: str | None,
    cancelled: str | None,
    error_code: str | None,
    emitted: bool,
    usage: Usage | None,
    partial: PartialUsage | None,
    prompt_estimate: Callable[[], int],
    ttft_s: float | None,
    duration_s: float,
    started_at: float,
    endpoint: str = "chat",
    filtered: str | None = None,
    priority: int | None = None,
    dropped_tools: str | None = None,
) -> UsageRecord:
    """The record of a request that reached the relay.

    ``usage`` is the vendor's final count (the answer's ``Usage`` event), ``partial`` what the
    parser knew when its stream ended; ``emitted`` whether any event reached the relay;
    ``prompt_estimate`` is called for a prompt the vendor never counted."""
    if cancelled is not None:
        outcome: Outcome = "cancelled"
        code: str | None = cancelled
    elif error_code is not None:
        code = error_code
        outcome = "refused" if error_code in REFUSAL_CODES and not emitted else "failed"
    else:
        outcome, code = "completed", None
    estimated = False
    if usage is None and partial is not None:
        usage, estimated = partial.usage, partial.estimated
        if estimated and usage.prompt_tokens == 0:
            usage = attrs.evolve(usage, prompt_tokens=prompt_estimate())
    return UsageRecord(
        request_id=request_id,
        key=key,
        alias=alias,
        provider=provider,
        outcome=outcome,
        error_code=code,
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        reasoning_tokens=(usage.reasoning_tokens or 0) if usage else 0,
        cached_tokens=(usage.cached_tokens or 0) if usage else 0,
        estimated=estimated,
        ttft_s=ttft_s,
        duration_s=duration_s,
        started_at=started_at,
        endpoint=endpoint,
        filtered=filtered,
        priority=priority,
        dropped_tools=dropped_tools,
    )


def refused_record(
    *,
    request_id: str,
    key: str | None,
    alias: str | None,
    error_code: str,
    started_at: float,
    duration_s: float = 0.0,
    cancelled: bool = False,
    endpoint: str = "chat",
) -> UsageRecord:
    """A request that never reached a provider: refused (or its client left first)."""
    return UsageRecord(
        request_id=request_id,
        key=key,
        alias=alias,
        provider=None,
        outcome="cancelled" if cancelled else "refused",
        error_code=error_code,
        duration_s=duration_s,
        started_at=started_at,
        endpoint=endpoint,
    )
