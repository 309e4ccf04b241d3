"""``/v1/completions`` and ``/v1/embeddings`` on the OpenAI wire (vLLM's, and OpenAI's own).

Pure: the upstream bodies, :class:`CompletionParser` (``text_completion`` chunks → events),
the whole answers of both, and the :class:`KindReader` the I/O shell reads them with. A
completion is asked to stream with usage, as a chat is, whether or not the client streams; an
embeddings answer is one JSON body.

What a vendor's model does not serve comes back as its 404 (vLLM registers ``/v1/embeddings``
only for a pooling model and answers FastAPI's ``{"detail":"Not Found"}`` otherwise; OpenAI
answers a chat model asked for a completion with a 404 of its own): that is
``unsupported_endpoint``, the request's fault, not a provider that is down. A 404 that says the
model does not exist stays what it is for chat, a misconfigured provider.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from trio_gateway.core.errors import GatewayError, UnsupportedEndpoint, UpstreamProtocolError
from trio_gateway.core.events import (
    CompletionText,
    Embeddings,
    Event,
    ResponseDone,
    ResponseStarted,
    Usage,
)
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.sse import SSEEvent, json_data
from trio_gateway.core.usage import PartialUsage
from trio_gateway.providers.dialect import StreamParser
from trio_gateway.providers.errors import classify_inband, error_message_and_param
from trio_gateway.providers.openai_compatible.stream_state import OpenAIStream
from trio_gateway.providers.openai_compatible.usage import parse_usage

# Choices one completion may hold: OpenAI's 2,048 prompts (core/endpoints.py) times its n <= 128.
MAX_CHOICES = 2048 * 128
# An embeddings answer is one body, and the largest the gateway takes: 2,048 inputs of 1,024
# floats as JSON are some 40 MB. A client with more asks for base64 (a third of that), or in
# batches.
MAX_EMBEDDINGS_BYTES = 64 * 1024 * 1024


class CompletionParser(OpenAIStream):
    """One upstream stream's ``text_completion`` chunks → events (``StreamParser``).

    Each choice's text comes as :class:`CompletionText` with its ``index``; the answer is
    done at ``[DONE]`` once some choice has finished. Usage as the chat parser keeps it: the
    latest cumulative counts (vLLM's ``continuous_usage_stats``), the closing chunk's total.
    """

    def feed_data(self, data: bytes) -> list[Event]:
        if data == b"[DONE]":
            return self._finish()
        if self._done:
            raise self._malformed("data after [DONE]")
        try:
            chunk = json_data(data)
        except ValueError as exc:
            raise self._malformed(f"not JSON: {exc}") from None
        if not isinstance(chunk, dict):
            raise self._malformed("not an object")
        if "error" in chunk or chunk.get("object") == "error":
            raise classify_inband(self._provider, chunk)
        events: list[Event] = []
        if not self._started:
            self._started = True
            events.append(ResponseStarted(provider=self._provider))
        choices = chunk.get("choices")
        if choices:
            if not isinstance(choices, list):
                raise self._malformed("'choices' is not a list")
            for choice in choices:
                event = self._choice(choice)
                if event is not None:
                    events.append(event)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
            self._unmetered = 0
            if not choices:
                events.append(parse_usage(usage))
        return events

    def _choice(self, choice: object) -> CompletionText | None:
        if not isinstance(choice, dict):
            raise self._malformed("a choice is not an object")
        index = choice.get("index", 0)
        if type(index) is not int or not 0 <= index < MAX_CHOICES:
            raise self._malformed(f"choice index {index!r}")
        text = choice.get("text") or ""
        finish_reason = choice.get("finish_reason")
        if type(text) is not str or not (finish_reason is None or type(finish_reason) is str):
            raise self._malformed("a choice's text or finish_reason is not a string")
        if finish_reason and self._finish_reason is None:
            self._finish_reason = finish_reason
        if not text and not finish_reason:
            return None
        if text:
            self._unmetered += 1
        return CompletionText(index=index, text=text, finish_reason=finish_reason or None)

    def _malformed(self, what: str) -> UpstreamProtocolError:
        return UpstreamProtocolError(
            f"{self._provider} sent a malformed completion chunk: {what}", provider=self._provider
        )


def parse_whole_completion(provider: str, body: bytes) -> list[Event]:
    """A whole ``text_completion`` (a server that did not stream) → a stream's events."""
    try:
        completion = json.loads(body)
        choices = completion["choices"]
    except (ValueError, KeyError, TypeError):
        raise UpstreamProtocolError(
            f"{provider} sent a whole answer that is not a text completion", provider=provider
        ) from None
    parser = CompletionParser(provider)
    events = parser.feed_data(json.dumps({"choices": choices}).encode())
    usage = completion.get("usage")
    if isinstance(usage, dict):
        events += parser.feed_data(json.dumps({"usage": usage}).encode())
    return events + parser.feed_data(b"[DONE]")


def parse_embeddings(provider: str, body: bytes) -> list[Event]:
    """An embeddings ``list`` → its vectors in input order, and its usage."""
    try:
        answer = json.loads(body)
        data = answer["data"]
        items = sorted(((item["index"], item["embedding"]) for item in data), key=_first)
    except (ValueError, KeyError, TypeError):
        raise UpstreamProtocolError(
            f"{provider} sent an answer that is not an embeddings list", provider=provider
        ) from None
    if [index for index, _ in items] != list(range(len(items))) or not all(
        isinstance(vector, list | str) for _, vector in items
    ):
        raise UpstreamProtocolError(
            f"{provider} sent embeddings without one vector per input", provider=provider
        )
    usage = answer.get("usage")
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return [
        ResponseStarted(provider=provider),
        Embeddings(vectors=tuple(vector for _, vector in items)),
        # An embedding generates nothing: every token is the prompt's.
        Usage(prompt_tokens=prompt if type(prompt) is int else 0, completion_tokens=0),
        ResponseDone(finish_reason="stop"),
    ]


def _first(item: tuple[Any, Any]) -> Any:
    return item[0]


class NoStream:
    """An embeddings answer never streams: an SSE body in its place is the vendor's error."""

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self.done = False

    def feed(self, event: SSEEvent) -> list[Event]:
        raise UpstreamProtocolError(
            f"{self._provider} streamed an answer to an embeddings request",
            provider=self._provider,
        )

    def close(self) -> list[Event]:
        return self.feed(SSEEvent(data=b""))

    def usage_so_far(self) -> PartialUsage | None:
        return None


class Classify(Protocol):
    """What a chat request's refusals are classified by (the dialect's ``classify_error``)."""

    def __call__(
        self, provider: str, status: int, body: bytes, headers: Mapping[str, str]
    ) -> GatewayError: ...


class KindReader:
    """Reads a completion's or an embeddings' answer for a dialect whose refusals it keeps,
    but for the 404 that says the model does not serve the endpoint."""

    def __init__(self, kind: RequestKind, classify: Classify) -> None:
        self._kind = kind
        self._classify = classify

    def new_parser(self, provider: str) -> StreamParser:
        if self._kind is RequestKind.EMBEDDINGS:
            return NoStream(provider)
        return CompletionParser(provider)

    def parse_whole(self, provider: str, body: bytes) -> list[Event]:
        if self._kind is RequestKind.EMBEDDINGS:
            return parse_embeddings(provider, body)
        return parse_whole_completion(provider, body)

    def classify_error(
        self, provider: str, status: int, body: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        if status == 404:
            message, _, code = error_message_and_param(body)
            if code != "model_not_found" and "does not exist" not in message:
                return UnsupportedEndpoint(
                    f"{provider}'s model does not serve {self._kind.path} (HTTP 404: {message})",
                    param="model",
                    provider=provider,
                )
        return self._classify(provider, status, body, headers)
