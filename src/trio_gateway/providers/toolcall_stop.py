"""Ending an answer at its first complete tool call. Pure.

vLLM 0.32 (hermes tool parser) under ``parallel_tool_calls: false`` still generates every tool
call the model writes and returns only the first: the GPU pays for calls nobody sees. So for an
``openai_compatible`` provider the gateway ends such an answer itself, at the first of:

- the first call's arguments, joined from their fragments, close a JSON object
  (:class:`ObjectEnd`, fed fragment by fragment, never re-reading what it has seen);
- a fragment of another call begins;
- the stream finishes (then nothing is cut: the answer passes as it came).

:class:`FirstToolCallOnly` wraps the dialect's stream parser and makes that decision; the
provider shell (``providers/upstream.py``) closes the upstream when it sees it stopped, which is
what makes vLLM abort the sequence, and then hands on the ending from :meth:`close`. Only a
request that asked for it gets the wrapper: other streams pay nothing per chunk.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from trio_gateway.core.events import Event, ResponseDone, ToolCallDelta, ToolCallDone
from trio_gateway.core.toolcalls import ToolCallAssembler

if TYPE_CHECKING:
    from trio_gateway.core.sse import SSEEvent
    from trio_gateway.core.usage import PartialUsage
    from trio_gateway.providers.dialect import StreamParser

# The only characters that move the scanner outside a string, and inside one.
_STRUCTURE = re.compile(r'["{}\[\]]')
_STRING = re.compile(r'["\\]')
_JSON_WHITESPACE = " \t\r\n"


class ObjectEnd:
    """Incremental: have the fragments fed so far closed a JSON object?

    Tracks nesting, strings and escapes only (braces inside strings, ``\\"``, an escape cut
    between two fragments); it does not validate numbers or literals, which the assembler's
    ``json.loads`` judges at the end. Each character is looked at once, whatever the fragments.
    Text that does not start as an object (after JSON whitespace), or brackets that do not
    match, make it give up for good: :meth:`feed` then answers False and the answer ends by the
    other rules.
    """

    __slots__ = ("_closers", "_escaped", "_in_string", "closed", "gave_up")

    def __init__(self) -> None:
        self._closers: list[str] = []  # what closes each open object or array, innermost last
        self._in_string = False
        self._escaped = False  # the last fragment ended on a backslash inside a string
        self.closed = False
        self.gave_up = False

    def feed(self, text: str) -> bool:
        """Take the next fragment; True once the object has closed (and from then on)."""
        if self.closed or self.gave_up:
            return self.closed
        pos, end = 0, len(text)
        if self._escaped and end:
            self._escaped, pos = False, 1
        closers = self._closers
        while pos < end:
            if self._in_string:
                match = _STRING.search(text, pos)
                if match is None:
                    return False
                pos = match.end()
                if match.group() == '"':
                    self._in_string = False
                elif pos == end:
                    self._escaped = True
                else:
                    pos += 1  # the escaped character, whatever it is
                continue
            match = _STRUCTURE.search(text, pos)
            if not closers:
                # Before the object: only whitespace may come first, then its "{".
                before = text[pos : match.start() if match else end]
                if before.strip(_JSON_WHITESPACE) or (match and match.group() != "{"):
                    self.gave_up = True
                    return False
            if match is None:
                return False
            char, pos = match.group(), match.end()
            if char == '"':
                self._in_string = True
            elif char == "{" or char == "[":
                closers.append("}" if char == "{" else "]")
            elif closers.pop() != char:
                self.gave_up = True
                return False
            elif not closers:
                self.closed = True
                return True
        return False


class FirstToolCallOnly:
    """A stream parser (``providers/dialect.py``) that ends the answer at the first tool call.

    Everything before the first call, and the call's fragments up to the one that completes it,
    pass through as the wrapped parser gives them. Then :attr:`stopped` is set, :attr:`done` is
    true, and :meth:`close` gives the ending: the call whole (``ToolCallDone``), the usage so
    far when the vendor's counts cover it, and ``ResponseDone("tool_calls")``. Nothing after the
    completing fragment is handed on, not even the rest of its chunk.
    """

    def __init__(self, inner: StreamParser) -> None:
        self._inner = inner
        self._index: int | None = None  # the first call's index
        self._arguments = ObjectEnd()
        self._call = ToolCallAssembler()
        # Set when the answer is cut: the ending close() hands on (once, then empty).
        self._ending: list[Event] | None = None

    @property
    def stopped(self) -> bool:
        """The answer was cut at the first call's end: :meth:`close` gives the ending."""
        return self._ending is not None

    @property
    def done(self) -> bool:
        return self.stopped or self._inner.done

    def usage_so_far(self) -> PartialUsage | None:
        return self._inner.usage_so_far()

    def feed(self, event: SSEEvent) -> list[Event]:
        events = self._inner.feed(event)
        for i, item in enumerate(events):
            if not isinstance(item, ToolCallDelta):
                continue
            if self._index is None:
                self._index = item.index
            elif item.index != self._index:
                return self._stop(events, i)
            self._call.add(item)
            if self._arguments.feed(item.arguments):
                if any(isinstance(later, ToolCallDone) for later in events[i + 1 :]):
                    return events  # the answer finished in this same chunk: nothing to save
                return self._stop(events, i + 1)
        return events

    def close(self) -> list[Event]:
        if self._ending is not None:
            ending, self._ending = self._ending, []
            return ending
        return self._inner.close()

    def _stop(self, events: list[Event], keep: int) -> list[Event]:
        ending: list[Event] = list(self._call.finish())
        partial = self._inner.usage_so_far()
        # Only the vendor's own counts (vLLM's continuous usage stats) go out as the answer's
        # usage; an estimate stays in the meter, where the usage record marks it estimated.
        if partial is not None and not partial.estimated:
            ending.append(partial.usage)
        ending.append(ResponseDone(finish_reason="tool_calls"))
        self._ending = ending
        return events[:keep]
