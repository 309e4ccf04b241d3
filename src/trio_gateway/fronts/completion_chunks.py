"""The encoders of ``/v1/completions`` and ``/v1/embeddings``: events → ``text_completion``
SSE chunks, or one ``text_completion`` or embeddings ``list``. Pure; the model is always the
alias the client used, as in a chat answer (``openai_chunks.py``).
"""

from __future__ import annotations

from typing import Any

from trio_gateway.core.events import CompletionText, Embeddings, Event, ResponseDone, Usage
from trio_gateway.core.sse import DONE, encode_event
from trio_gateway.fronts.openai_chunks import dumps


def completion_usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


class CompletionChunkEncoder:
    """Events → SSE bytes for one streamed completion: a chunk per piece of a choice's text
    (its ``finish_reason`` on the last), then the usage chunk when the client asked for it
    (``stream_options.include_usage``, as OpenAI sends it: ``choices: []``), then ``[DONE]``."""

    def __init__(
        self, *, completion_id: str, created: int, model: str, include_usage: bool
    ) -> None:
        self._meta: dict[str, Any] = {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage
        self._usage: Usage | None = None

    def encode(self, event: Event) -> bytes:
        if isinstance(event, CompletionText):
            chunk = dict(self._meta)
            chunk["choices"] = [
                {
                    "index": event.index,
                    "text": event.text,
                    "logprobs": None,
                    "finish_reason": event.finish_reason,
                }
            ]
            if self._include_usage:
                chunk["usage"] = None
            return encode_event(dumps(chunk))
        if isinstance(event, Usage):
            # Held back: it goes after every choice's last chunk, and only when asked.
            self._usage = event
            return b""
        if isinstance(event, ResponseDone):
            out = b""
            if self._include_usage and self._usage is not None:
                chunk = dict(self._meta)
                chunk["choices"] = []
                chunk["usage"] = completion_usage(self._usage)
                out = encode_event(dumps(chunk))
            return out + DONE
        return b""  # ResponseStarted: a completion has no role chunk


class CompletionAccumulator:
    """Events → one ``text_completion`` object, for a client that did not stream."""

    def __init__(self, *, completion_id: str, created: int, model: str) -> None:
        self._meta: dict[str, Any] = {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
        }
        self._texts: dict[int, list[str]] = {}
        self._finish: dict[int, str | None] = {}
        self._usage: Usage | None = None
        self.finish_reason: str | None = None

    def add(self, event: Event) -> None:
        if isinstance(event, CompletionText):
            self._texts.setdefault(event.index, []).append(event.text)
            if event.finish_reason is not None or event.index not in self._finish:
                self._finish[event.index] = event.finish_reason
        elif isinstance(event, Usage):
            self._usage = event
        elif isinstance(event, ResponseDone):
            self.finish_reason = event.finish_reason

    def result(self) -> dict[str, Any]:
        body = dict(self._meta)
        body["choices"] = [
            {
                "index": index,
                "text": "".join(self._texts[index]),
                "logprobs": None,
                "finish_reason": self._finish.get(index),
            }
            for index in sorted(self._texts)
        ]
        if self._usage is not None:
            body["usage"] = completion_usage(self._usage)
        return body


class EmbeddingsAccumulator:
    """Events → one embeddings ``list``: each vector as the vendor sent it (floats, or base64
    when the client asked ``encoding_format: "base64"``)."""

    def __init__(self, *, model: str) -> None:
        self._model = model
        self._vectors: tuple[list[float] | str, ...] = ()
        self._usage: Usage | None = None
        self.finish_reason: str | None = None

    def add(self, event: Event) -> None:
        if isinstance(event, Embeddings):
            self._vectors = event.vectors
        elif isinstance(event, Usage):
            self._usage = event
        elif isinstance(event, ResponseDone):
            self.finish_reason = event.finish_reason

    def result(self) -> dict[str, Any]:
        prompt = self._usage.prompt_tokens if self._usage is not None else 0
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": vector}
                for index, vector in enumerate(self._vectors)
            ],
            "model": self._model,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        }
