"""What a vendor's wire dialect must provide: pure functions and parsers, no I/O.

The I/O shell (``providers/upstream.py``) is the same for every vendor: it asks the dialect for
the upstream call, sends it, feeds the SSE events it reads to the dialect's parser, emits the
events that come out, and asks the dialect what a non-2xx answer means. Credentials are attached
by the shell (``auth_headers``), never placed in a body, a URL or a log line.

A parser turns one upstream answer into the gateway's events, in this order:

- ``ResponseStarted(provider)`` once, before anything else;
- ``ReasoningDelta`` / ``TextDelta`` / ``ToolCallDelta`` fragments as they arrive (thinking text is
  always ``ReasoningDelta``, never ``TextDelta``; each tool call has a stable ``index`` and, on its
  first fragment, an ``id`` and a ``name``: a vendor without ids gets generated ones); among
  them, whole ``ReasoningDetail`` events, what the vendor needs back to go on thinking
  (``core/reasoning_details.py``);
- at the end: every ``ToolCallDone`` (from ``toolcalls.ToolCallAssembler.finish``), then one
  ``Usage`` (the answer's cumulative totals, normalised as OpenAI counts them: cached tokens are
  inside prompt tokens, reasoning tokens inside completion tokens), then ``ResponseDone`` with an
  OpenAI ``finish_reason`` (``stop``, ``length``, ``tool_calls``, ``content_filter``);
  ``finish_reason`` is ``tool_calls`` whenever the answer ends in tool calls.

Errors are raised as :class:`~trio_gateway.core.errors.GatewayError` subclasses: an error the vendor
sends inside its stream is raised from ``feed``; a stream that ends before the answer does is an
``UpstreamProtocolError`` from ``close``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import GatewayError, UnsupportedEndpoint
from trio_gateway.core.events import Event
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.sse import SSEEvent
from trio_gateway.core.usage import PartialUsage


@attrs.frozen(kw_only=True)
class UpstreamCall:
    """One HTTP request to a vendor, without its credentials."""

    url: str
    body: bytes
    headers: Mapping[str, str] = attrs.field(factory=dict)
    # The vendor generates every tool call but returns only the first (vLLM under
    # ``parallel_tool_calls: false``): the shell ends the answer, and the upstream, at the first
    # complete call (``toolcall_stop.py``).
    first_tool_call_only: bool = False
    # How the answer is read when it is not a chat completion (``/v1/completions``,
    # ``/v1/embeddings``): None reads it with the dialect itself.
    reader: AnswerReader | None = None
    # The largest whole (JSON) answer taken; None: the shell's own bound.
    max_whole_bytes: int | None = None


class StreamParser(Protocol):
    """One upstream answer's SSE events → gateway events."""

    @property
    def done(self) -> bool:
        """The answer is complete: the shell stops reading (and does not wait for the close)."""
        ...

    def feed(self, event: SSEEvent) -> list[Event]: ...

    def close(self) -> list[Event]:
        """The byte stream ended: the last events, or an ``UpstreamProtocolError`` if cut."""
        ...

    def usage_so_far(self) -> PartialUsage | None:
        """The answer's usage as far as it was streamed (None before anything was): asked
        once, when the stream ends, so a cut stream is billed too. Keeping it must cost no
        more than an assignment per chunk."""
        ...


class AnswerReader(Protocol):
    """How one kind of answer is read: its stream, its whole body, its refusals."""

    def new_parser(self, provider: str) -> StreamParser: ...

    def parse_whole(self, provider: str, body: bytes) -> list[Event]: ...

    def classify_error(
        self, provider: str, status: int, body: bytes, headers: Mapping[str, str]
    ) -> GatewayError: ...


class Dialect(Protocol):
    def build_call(self, request: ChatRequest, provider: ProviderConfig) -> UpstreamCall:
        """The upstream request for ``request`` (streaming, where its kind streams); raises
        ``RequestError`` for what the vendor cannot express (the gateway's validation has
        already run), ``UnsupportedEndpoint`` for a kind it does not serve."""
        ...

    def max_output_tokens(self, request: ChatRequest, provider: ProviderConfig) -> int:
        """The most output tokens (reasoning included) the call ``build_call`` makes for
        ``request`` lets the vendor produce: what a budget hold is computed from. Never raises:
        a request the vendor cannot express is refused later, by ``build_call``."""
        ...

    def new_parser(self, provider: str) -> StreamParser: ...

    def parse_whole(self, provider: str, body: bytes) -> list[Event]:
        """A whole (non-streamed) JSON answer → the same events a stream would give."""
        ...

    def classify_error(
        self, provider: str, status: int, body: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        """A non-2xx answer → the gateway's error (``headers`` keys are lower case)."""
        ...

    def auth_headers(self, credential: str) -> dict[str, str]:
        """The headers that carry ``credential`` (an API key, or an OAuth2 access token)."""
        ...


def chat_only(request: ChatRequest, vendor: str) -> None:
    """For a dialect that speaks chat alone: refuse any other kind before anything is sent
    (routing keeps such requests away already; this is the second line)."""
    if request.kind is not RequestKind.CHAT:
        raise UnsupportedEndpoint(
            f"{vendor} providers do not serve {request.kind.path}", param="model"
        )
