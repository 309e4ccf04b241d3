"""The ``gemini`` (AI Studio) and ``vertex`` (Vertex AI) provider types as :class:`Dialect`\\s.

Pure. Both speak one wire, ``streamGenerateContent?alt=sse``; they differ in the URL and in the
credential (an API key in ``x-goog-api-key``, or an OAuth2 access token as a bearer). Request
translation lives in ``gemini_request.py`` (its docstring tables every OpenAI field); here are
the stream parser, the whole-answer parser and the error classification.

The stream: data-only SSE frames ending in ``\\r\\n\\r\\n``, each a ``GenerateContentResponse``
(``candidates[0].content.parts``, ``usageMetadata``); no ``[DONE]``, the close of the body ends
it. The last chunk carries ``finishReason`` and, normally, the final ``usageMetadata``. Errors
after the 200 come as one ``{"error": {...}}`` frame (a google.rpc Status) before the close.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import quote

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import (
    GatewayError,
    UnusableAnswer,
    UpstreamProtocolError,
    UpstreamServerError,
)
from trio_gateway.core.events import (
    Event,
    ReasoningDelta,
    ReasoningDetail,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from trio_gateway.core.reasoning_details import GOOGLE, MAX_DETAILS
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.sse import SSEEvent, json_data
from trio_gateway.core.toolcalls import ToolCallAssembler
from trio_gateway.core.usage import PartialUsage, estimate_tokens
from trio_gateway.providers.dialect import UpstreamCall, chat_only
from trio_gateway.providers.gemini.errors import (
    classify_error,
    classify_stream_error,
    retry_delay_s,
)
from trio_gateway.providers.gemini.request import DROPPED_FIELDS, REFUSED_FIELDS, build_body
from trio_gateway.providers.output_caps import held_output_tokens
from trio_gateway.providers.translate import new_tool_call_id, redact_credentials

__all__ = [
    "DROPPED_FIELDS",
    "FAILED_FINISH_REASONS",
    "FINISH_REASONS",
    "REFUSED_FIELDS",
    "GeminiDialect",
    "GeminiStreamParser",
    "VertexDialect",
    "build_body",
    "classify_error",
    "parse_whole",
    "retry_delay_s",
]

# More parallel tool calls than any model makes: a bound on what one answer may hold.
MAX_TOOL_CALLS: Final = 128

# finishReason → OpenAI finish_reason, for the reasons that end an answer (Google's FinishReason
# enum: https://ai.google.dev/api/generate-content#FinishReason, and Vertex AI's, which adds
# MODEL_ARMOR). Every reason meaning "the output was withheld or cut by a filter or a policy"
# is content_filter, as OpenAI reports filtered output; a token limit is length.
FINISH_REASONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "STOP": "stop",
        "MAX_TOKENS": "length",
        # The per-request token limit was reached, generation not complete.
        "CONTINUATION": "length",
        "SAFETY": "content_filter",
        "RECITATION": "content_filter",
        "LANGUAGE": "content_filter",  # flagged for an unsupported language
        "BLOCKLIST": "content_filter",
        "PROHIBITED_CONTENT": "content_filter",
        "SPII": "content_filter",
        "IMAGE_SAFETY": "content_filter",
        "IMAGE_PROHIBITED_CONTENT": "content_filter",
        "IMAGE_RECITATION": "content_filter",
        "MODEL_ARMOR": "content_filter",
        "ESCALATION": "content_filter",  # filtered by an escalation rule
    }
)
# The reasons that mean the model failed to answer: an empty or cut answer that would look like
# success as "stop". They end the request with an ``upstream_error`` naming the reason (in-band
# once the client has seen the answer begin); so does any reason not in either table.
FAILED_FINISH_REASONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "FINISH_REASON_UNSPECIFIED": "no reason given",
        "OTHER": "stopped for a reason not otherwise specified",
        "MALFORMED_FUNCTION_CALL": "the model generated a function call that cannot be parsed",
        "UNEXPECTED_TOOL_CALL": "the model called a tool that is not declared or not enabled",
        "TOO_MANY_TOOL_CALLS": "the model made too many tool calls in one request",
        "MISSING_THOUGHT_SIGNATURE": "a thought signature is missing from the request",
        "MALFORMED_RESPONSE": "the model's response was malformed",
        "IMAGE_OTHER": "image generation stopped for a reason not otherwise specified",
        "NO_IMAGE": "the model was expected to generate an image and did not",
        "PUP_LIMITED_DISABLED": "the account is limited or disabled for Prohibited Use "
        "Policy violations",
    }
)
# Of Gemini's own words for the failure (``finishMessage``), this much is kept.
MAX_FINISH_MESSAGE_CHARS: Final = 500


# --- errors ------------------------------------------------------------------------------------


# --- the stream --------------------------------------------------------------------------------


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def parse_usage(metadata: Mapping[str, Any]) -> Usage:
    """``usageMetadata`` → OpenAI's counts: ``promptTokenCount`` already holds the cached
    tokens, and the completion is the answer plus the thoughts."""
    thoughts = _count(metadata.get("thoughtsTokenCount"))
    return Usage(
        prompt_tokens=_count(metadata.get("promptTokenCount")) or 0,
        completion_tokens=(_count(metadata.get("candidatesTokenCount")) or 0) + (thoughts or 0),
        reasoning_tokens=thoughts,
        cached_tokens=_count(metadata.get("cachedContentTokenCount")),
    )


class GeminiStreamParser:
    """One answer's SSE events → gateway events (the order of ``providers/dialect.py``).

    When the answer is complete: Gemini marks the end with ``finishReason`` and the close, not
    with a frame of its own, and ``usageMetadata`` (cumulative on every chunk: the last one is
    the total) normally rides on the finishing chunk. So the parser is ``done`` as soon as it
    has seen a ``finishReason`` and a ``usageMetadata`` on that chunk or a later one; a finish
    without usage waits for the close, where :meth:`close` ends the answer with the last usage
    seen (none at all: no ``Usage`` event, rather than an invented zero). A close before any
    ``finishReason`` is an ``UpstreamProtocolError``.

    A ``finishReason`` that means the model produced no answer (:data:`FAILED_FINISH_REASONS`,
    and any reason in neither table) is raised as :class:`UnusableAnswer`, an ``upstream_error``
    naming it, once the chunk's usage is kept: an empty answer must not look like success.

    A prompt blocked before generation (``promptFeedback.blockReason``, no candidates) is an
    answer with no content and ``finish_reason: content_filter``, as OpenAI reports filtered
    output: the request was well formed, and another vendor's filter is not a retry to try.

    Only ``candidates[0]`` is read (the gateway asks for one). Parts other than text, thoughts and
    function calls (code execution, inline images) are never asked for and are skipped. A part's
    ``thoughtSignature`` is handed on as a :class:`ReasoningDetail` (``id``: the call it was sent
    on), for the client to send back (``request.py``): Gemini 3 refuses a call without it. What
    the parser keeps is bounded: the tool calls (at most :data:`MAX_TOOL_CALLS`, their arguments
    bounded by the assembler), the number of signatures seen and the last usage.
    """

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._started = False
        self._done = False
        self._finish_reason: str | None = None  # OpenAI's, once Gemini has said it
        self._failed: UnusableAnswer | None = None  # a finishReason that is no answer
        self._usage: Usage | None = None
        self._tool_calls = ToolCallAssembler()
        self._tool_count = 0
        self._signatures = 0
        # Characters streamed since the last usageMetadata, for a stream cut short.
        self._unmetered_chars = 0

    @property
    def done(self) -> bool:
        return self._done

    def usage_so_far(self) -> PartialUsage | None:
        """``usageMetadata`` is cumulative on every chunk: exact while the last chunk with
        content carried it; else the last count plus the characters streamed after it / 4
        (no count at all: the characters alone), marked estimated."""
        if not self._started:
            return None
        if self._usage is not None and not self._unmetered_chars:
            return PartialUsage(self._usage, estimated=False)
        usage = self._usage or Usage(0, 0)
        extra = estimate_tokens(self._unmetered_chars)
        return PartialUsage(
            Usage(
                usage.prompt_tokens,
                usage.completion_tokens + extra,
                usage.reasoning_tokens,
                usage.cached_tokens,
            ),
            estimated=True,
        )

    def feed(self, event: SSEEvent) -> list[Event]:
        if not event.data:
            return []
        if self._done:
            raise self._malformed("data after the answer finished")
        try:
            payload = json_data(event.data)
        except ValueError as exc:
            raise self._malformed(f"a chunk that is not JSON ({exc})") from None
        if not isinstance(payload, dict):
            raise self._malformed("a chunk that is not an object")
        return self.handle(payload)

    def close(self) -> list[Event]:
        if self._done:
            return []
        if self._finish_reason is None:
            raise UpstreamProtocolError(
                f"{self._provider} closed the stream before the answer finished",
                provider=self._provider,
            )
        return self._finish()

    def _malformed(self, what: str) -> UpstreamProtocolError:
        return UpstreamProtocolError(
            f"{self._provider} sent a malformed stream: {what}", provider=self._provider
        )

    def handle(self, payload: Mapping[str, Any]) -> list[Event]:
        """One decoded ``GenerateContentResponse`` (also how :func:`parse_whole` reads one)."""
        if "error" in payload:
            raise classify_stream_error(self._provider, payload["error"])
        events: list[Event] = []
        if not self._started:
            self._started = True
            events.append(ResponseStarted(provider=self._provider))
        metadata = payload.get("usageMetadata")
        if isinstance(metadata, dict):
            self._usage = parse_usage(metadata)
        candidates = payload.get("candidates")
        if candidates is not None and not isinstance(candidates, list):
            raise self._malformed("'candidates' is not a list")
        if candidates:
            self._candidate(candidates[0], events)
        elif self._blocked(payload.get("promptFeedback")):
            # A blocked prompt is the whole answer: nothing follows it.
            self._finish_reason = "content_filter"
            return events + self._finish()
        if isinstance(metadata, dict):
            self._unmetered_chars = 0  # the count covers this chunk too
        if self._failed is not None:
            # The usage so far is kept (usage_so_far): what was generated is billed.
            raise self._failed
        if isinstance(metadata, dict) and self._finish_reason is not None:
            events += self._finish()
        return events

    @staticmethod
    def _blocked(feedback: object) -> bool:
        return isinstance(feedback, dict) and bool(feedback.get("blockReason"))

    def _candidate(self, candidate: object, events: list[Event]) -> None:
        if not isinstance(candidate, dict):
            raise self._malformed("a candidate that is not an object")
        content = candidate.get("content") or {}
        if not isinstance(content, dict):
            raise self._malformed("a candidate's 'content' is not an object")
        parts = content.get("parts") or []
        if not isinstance(parts, list):
            raise self._malformed("'parts' is not a list")
        for part in parts:
            self._part(part, events)
        reason = candidate.get("finishReason")
        if reason is not None:
            if not isinstance(reason, str):
                raise self._malformed("'finishReason' is not a string")
            finish = FINISH_REASONS.get(reason)
            if finish is None:
                self._failed = self._unusable(reason, candidate.get("finishMessage"))
                return
            if finish == "stop" and self._tool_count:
                # The answer ends in tool calls, whatever Gemini named its stop.
                finish = "tool_calls"
            self._finish_reason = finish

    def _unusable(self, reason: str, message: object) -> UnusableAnswer:
        what = FAILED_FINISH_REASONS.get(reason, "a finish reason the gateway does not know")
        text = f"{self._provider}: the answer ended with finishReason {reason} ({what})"
        if isinstance(message, str) and message:
            text += ": " + redact_credentials(message)[:MAX_FINISH_MESSAGE_CHARS]
        return UnusableAnswer(text, provider=self._provider)

    def _part(self, part: object, events: list[Event]) -> None:
        if not isinstance(part, dict):
            raise self._malformed("a part that is not an object")
        text = part.get("text")
        if text is not None:
            if not isinstance(text, str):
                raise self._malformed("a part's text is not a string")
            if text:
                self._unmetered_chars += len(text)
                thought = part.get("thought") is True
                events.append(ReasoningDelta(text=text) if thought else TextDelta(text=text))
        signature = part.get("thoughtSignature")
        call = part.get("functionCall")
        call_id = None
        if call is not None:
            delta = self._tool_call(call)
            events.append(delta)
            call_id = delta.id
        if signature is not None:
            if not isinstance(signature, str):
                raise self._malformed("a thoughtSignature that is not a string")
            if signature:
                events.append(self._signature(signature, call_id))

    def _signature(self, signature: str, call_id: str | None) -> ReasoningDetail:
        if self._signatures >= MAX_DETAILS:
            raise self._malformed(f"more than {MAX_DETAILS} thought signatures")
        detail = ReasoningDetail(self._signatures, GOOGLE, data=signature, tool_call_id=call_id)
        self._signatures += 1
        return detail

    def _tool_call(self, call: object) -> ToolCallDelta:
        if not isinstance(call, dict):
            raise self._malformed("a functionCall that is not an object")
        name = call.get("name")
        if not isinstance(name, str) or not name:
            raise self._malformed("a functionCall without a name")
        if self._tool_count >= MAX_TOOL_CALLS:
            raise self._malformed(f"more than {MAX_TOOL_CALLS} function calls")
        args = call.get("args")
        # A whole call arrives in one part: its arguments are complete, and a call without
        # any reads as "{}", as an OpenAI client expects to parse them.
        arguments = "{}" if args is None else json.dumps(args, ensure_ascii=False)
        # Gemini's calls have no ids (results are matched by name): one is made here, once
        # per call, so every fragment and the assembled call share it.
        self._unmetered_chars += len(arguments)
        delta = ToolCallDelta(self._tool_count, new_tool_call_id(), name, arguments)
        self._tool_count += 1
        try:
            self._tool_calls.add(delta)
        except ValueError as exc:  # the assembler's bound on argument size
            raise self._malformed(str(exc)) from None
        return delta

    def _finish(self) -> list[Event]:
        assert self._finish_reason is not None
        self._done = True
        events: list[Event] = list(self._tool_calls.finish())
        if self._usage is not None:
            events.append(self._usage)
        events.append(ResponseDone(finish_reason=self._finish_reason))
        return events


def parse_whole(provider: str, body: bytes) -> list[Event]:
    """A whole ``GenerateContentResponse`` (``:generateContent``), or the JSON array of them that
    ``:streamGenerateContent`` without ``alt=sse`` gives → the events its stream would give."""
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise UpstreamProtocolError(
            f"{provider} sent an answer that is not JSON ({exc})", provider=provider
        ) from None
    responses = parsed if isinstance(parsed, list) else [parsed]
    parser = GeminiStreamParser(provider)
    events: list[Event] = []
    for response in responses:
        if not isinstance(response, dict):
            raise UpstreamProtocolError(
                f"{provider} sent an answer that is not an object", provider=provider
            )
        if parser.done:
            break
        events += parser.handle(response)
    return events + parser.close()


# --- the dialects ------------------------------------------------------------------------------


def _path_segment(value: str) -> str:
    return quote(value, safe="")


class GeminiDialect:
    """Gemini on AI Studio (``generativelanguage.googleapis.com``), keyed by API key."""

    def url(self, provider: ProviderConfig) -> str:
        model = _path_segment(provider.model.removeprefix("models/"))
        return provider.endpoint + f"/v1beta/models/{model}:streamGenerateContent?alt=sse"

    def build_call(self, request: ChatRequest, provider: ProviderConfig) -> UpstreamCall:
        chat_only(request, "Gemini and Vertex AI")
        body = build_body(request, provider)
        return UpstreamCall(
            url=self.url(provider),
            body=json.dumps(body, ensure_ascii=False).encode(),
            headers={"content-type": "application/json", "accept": "text/event-stream"},
        )

    def max_output_tokens(self, request: ChatRequest, provider: ProviderConfig) -> int:
        # maxOutputTokens is the client's limit, thoughts inside it; none: the model's cap.
        return held_output_tokens(request.body, provider)

    def new_parser(self, provider: str) -> GeminiStreamParser:
        return GeminiStreamParser(provider)

    def parse_whole(self, provider: str, body: bytes) -> list[Event]:
        return parse_whole(provider, body)

    def classify_error(
        self, provider: str, status: int, body: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        return classify_error(provider, status, body, headers)

    def auth_headers(self, credential: str) -> dict[str, str]:
        return {"x-goog-api-key": credential}


class VertexDialect(GeminiDialect):
    """Gemini on Vertex AI: the same wire under a project and a region, with an OAuth2 token."""

    def url(self, provider: ProviderConfig) -> str:
        if not provider.project or not provider.location:
            # The config loader requires both for type "vertex"; a hand-built config may not.
            raise UpstreamServerError(
                f"{provider.name}: a vertex provider needs a project and a location",
                provider=provider.name,
            )
        project = _path_segment(provider.project)
        location = _path_segment(provider.location)
        model = _path_segment(provider.model.removeprefix("models/"))
        return provider.endpoint + (
            f"/v1/projects/{project}/locations/{location}/publishers/google/models/{model}"
            ":streamGenerateContent?alt=sse"
        )

    def auth_headers(self, credential: str) -> dict[str, str]:
        return {"authorization": f"Bearer {credential}"}
