"""Pure parts of the `gemini` dialect: Google's generateContent API, as AI Studio
(`/v1beta/models/M:generateContent`) and Vertex AI (`/v1/projects/P/locations/L/publishers/
google/models/M:...`) serve it.

The body is checked like Google's proto-JSON parser does (`gemini_request.py`: unknown names
are refused everywhere, camelCase and snake_case both accepted) and turned into the engine's
`ChatRequest`, with the messages normalised to chat-completion shape so the script, prompt
count and seed work as in every dialect (a user turn made only of `functionResponse` parts
plays OpenAI's `tool` message). Here: the answer, streamed or whole, and scripted faults.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from .errors import ApiError
from .gemini_request import (
    STATUSES,
    GeminiRequest,
    GeminiRoute,
    google_error,
    parse_generate_request,
    parse_route,
)
from .gemini_signatures import sign
from .script import Fault, Generation
from .wire import dumps

__all__ = [
    "GeminiContext",
    "GeminiRequest",
    "GeminiRoute",
    "GeminiStream",
    "gemini_fault",
    "google_error",
    "parse_generate_request",
    "parse_route",
    "response_body",
]

DEFAULT_RETRY_DELAY_S = 4.0  # RetryInfo.retryDelay of a 429 whose script gives no retry_after
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"

_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}


def _seconds(value: float) -> str:
    return f"{int(value)}s" if float(value).is_integer() else f"{value}s"


def _fault_error(fault: Fault) -> dict[str, Any]:
    status, message = STATUSES.get(fault.status, ("UNKNOWN", ""))
    retry = fault.retry_after
    if retry is None and fault.status == 429:
        retry = DEFAULT_RETRY_DELAY_S
    details = [] if retry is None else [{"@type": _RETRY_INFO, "retryDelay": _seconds(retry)}]
    error = google_error(
        fault.status, message or f"simulated HTTP {fault.status}", fault.error or status, details
    )
    body: dict[str, Any] = error.body
    return body


def gemini_fault(fault: Fault) -> ApiError:
    body = fault.body if fault.body is not None else _fault_error(fault)
    return ApiError(status=fault.status, body=body)


# ---- the answer ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class GeminiContext:
    response_id: str
    model: str
    prompt_tokens: int
    include_thoughts: bool
    thinking: bool
    signing_key: bytes  # the simulator's own: what it signs, it recognises (gemini_signatures)
    sse: bool = True  # streamGenerateContent?alt=sse; else one JSON array, streamed


def _usage(ctx: GeminiContext, output: int, thoughts: int, cached: int) -> dict[str, Any]:
    usage: dict[str, Any] = {"promptTokenCount": ctx.prompt_tokens}
    if output - thoughts:
        usage["candidatesTokenCount"] = output - thoughts
    usage["totalTokenCount"] = ctx.prompt_tokens + output
    if cached:
        usage["cachedContentTokenCount"] = cached
    usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": ctx.prompt_tokens}]
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return usage


def _call_part(ctx: GeminiContext, name: str, arguments: str, signed: bool) -> dict[str, Any]:
    try:
        args = json.loads(arguments)
    except ValueError:
        args = {}  # a scripted invalid-JSON argument string has no functionCall form
    part: dict[str, Any] = {"functionCall": {"name": name, "args": args}}
    if signed:
        # Thinking models sign the first function call of a step.
        seed = f"{ctx.response_id}|{name}|{arguments}"
        part["thoughtSignature"] = sign(ctx.signing_key, seed)
    return part


class _Parts:
    """Accumulates generated tokens into Gemini parts; a function call is one whole part."""

    def __init__(self, ctx: GeminiContext) -> None:
        self._ctx = ctx
        self.thoughts = 0
        self._call: tuple[str, list[str]] | None = None
        self._signed = False

    def _flush_call(self) -> list[dict[str, Any]]:
        if self._call is None:
            return []
        name, pieces = self._call
        self._call = None
        signed = self._ctx.thinking and not self._signed
        self._signed = True
        return [_call_part(self._ctx, name, "".join(pieces), signed)]

    def add(self, kind: str, text: str) -> list[dict[str, Any]]:
        if kind == "tool_args" and self._call is not None:
            self._call[1].append(text)
            return []
        parts = self._flush_call()
        if kind == "reasoning":
            self.thoughts += 1
            if self._ctx.include_thoughts:
                parts.append({"text": text, "thought": True})
        elif kind == "content" and text:
            parts.append({"text": text})
        elif kind == "tool_name":
            self._call = (text, [])
        return parts

    def end(self) -> list[dict[str, Any]]:
        return self._flush_call()


def finish_reason(generation: Generation) -> str:
    return generation.vendor_finish or _FINISH[generation.finish_reason]


def _response(
    ctx: GeminiContext, parts: list[dict[str, Any]], usage: dict[str, Any], finish: str | None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
        candidate["index"] = 0
    return {
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": ctx.model,
        "responseId": ctx.response_id,
    }


class GeminiStream:
    """streamGenerateContent, one generated token at a time (feed 0, 1, ... in order). SSE
    frames end in CRLF CRLF and nothing marks the end but the close."""

    def __init__(self, ctx: GeminiContext, generation: Generation) -> None:
        self._ctx = ctx
        self._generation = generation
        self._parts = _Parts(ctx)
        self._cached = 0
        self._frames = 0

    def _frame(self, value: Any) -> bytes:
        self._frames += 1
        if self._ctx.sse:
            return b"data: " + dumps(value) + b"\r\n\r\n"
        return (b"[" if self._frames == 1 else b",\r\n") + dumps(value)

    def token(self, index: int, cached_tokens: int = 0) -> list[bytes]:
        if index == 0:
            self._cached = cached_tokens
        token = self._generation.tokens[index]
        parts = self._parts.add(token.kind, token.text)
        last = index == len(self._generation.tokens) - 1
        if last:
            parts += self._parts.end()
        if not parts and not last:
            return []
        usage = _usage(self._ctx, index + 1, self._parts.thoughts, self._cached)
        finish = finish_reason(self._generation) if last else None
        frames = [self._frame(_response(self._ctx, parts or [{"text": ""}], usage, finish))]
        if last and not self._ctx.sse:
            frames.append(b"]")
        return frames

    def stream_error(self, fault: Fault) -> list[bytes]:
        # Google ends a failing stream with one error object where the next chunk would be.
        body = gemini_fault(fault).body
        return [self._frame(body), b""] if self._ctx.sse else [self._frame(body), b"]"]


def response_body(
    ctx: GeminiContext, generation: Generation, produced: int, cached_tokens: int
) -> dict[str, Any]:
    """The whole generateContent answer after `produced` tokens: one part per kind."""
    acc = _Parts(ctx)
    parts: list[dict[str, Any]] = []
    for token in generation.tokens[:produced]:
        for part in acc.add(token.kind, token.text):
            merge = parts and "text" in part and "text" in parts[-1]
            if merge and part.get("thought") == parts[-1].get("thought"):
                parts[-1]["text"] += part["text"]
            else:
                parts.append(part)
    parts += acc.end()
    usage = _usage(ctx, produced, acc.thoughts, cached_tokens)
    return _response(ctx, parts, usage, finish_reason(generation))
