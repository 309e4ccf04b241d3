"""What the OpenAI-shaped stream parsers share (chat and text completions): the stream's end
(``[DONE]``, a finish reason, a cut) and the usage counted so far. Pure."""

from __future__ import annotations

from typing import Any

from trio_gateway.core.errors import UpstreamProtocolError
from trio_gateway.core.events import Event, ResponseDone, Usage
from trio_gateway.core.sse import SSEEvent
from trio_gateway.core.usage import PartialUsage
from trio_gateway.providers.openai_compatible.usage import parse_usage


class OpenAIStream:
    """The state both parsers keep; each subclass reads its own chunks in ``feed_data``."""

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._started = False
        self._finish_reason: str | None = None
        # vLLM's choice.stop_reason: the stop string that ended the answer (an int: a token id).
        self._stop_sequence: str | None = None
        self._done = False
        # The latest cumulative usage object (vLLM's continuous_usage_stats: on every chunk),
        # kept as decoded and parsed only if the stream is cut; and the fragments streamed since.
        self._usage: dict[str, Any] | None = None
        self._unmetered = 0

    @property
    def done(self) -> bool:
        return self._done

    def usage_so_far(self) -> PartialUsage | None:
        """Exact while the last chunk carried cumulative usage (vLLM with
        continuous_usage_stats); else the last count plus one token per fragment streamed after
        it (OpenAI and vLLM send one token per chunk), marked estimated."""
        if not self._started:
            return None
        usage = parse_usage(self._usage) if self._usage is not None else Usage(0, 0)
        if not self._unmetered:
            return PartialUsage(usage, estimated=self._usage is None)
        usage = Usage(
            usage.prompt_tokens,
            usage.completion_tokens + self._unmetered,
            usage.reasoning_tokens,
            usage.cached_tokens,
        )
        return PartialUsage(usage, estimated=True)

    def feed(self, event: SSEEvent) -> list[Event]:
        return self.feed_data(event.data)

    def feed_data(self, data: bytes) -> list[Event]:
        raise NotImplementedError

    def _finish(self) -> list[Event]:
        self._done = True
        if self._finish_reason is None:
            raise UpstreamProtocolError(
                f"{self._provider} ended the stream without a finish_reason",
                provider=self._provider,
            )
        stop = self._stop_sequence if self._finish_reason == "stop" else None
        return [ResponseDone(finish_reason=self._finish_reason, stop_sequence=stop)]

    def close(self) -> list[Event]:
        """The byte stream ended. Without ``[DONE]`` the answer may be cut short."""
        if self._done:
            return []
        if self._finish_reason is not None:
            # Finished but no [DONE]: some servers omit it; the answer is whole.
            return self._finish()
        raise UpstreamProtocolError(
            f"{self._provider} closed the stream before the answer finished",
            provider=self._provider,
        )
