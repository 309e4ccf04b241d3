"""A stream's output filters, field by field, and a request's input filters. Pure; a field's text
is filtered by ``core/field_filter.py`` (split-safe, on the normalized form), matches are found
by ``core/filter_match.py``.

**Order.** An answer's parts come in an order its clients rely on (Anthropic's refuse a thinking
block after a ``tool_use``; a chat client shows reasoning before the call it led to). A field's
held-back text (the start of what could be a match) is said, masked as needed, as soon as that
field cannot go on: another field starts (the content after the reasoning, a tool call, another
tool call, a reasoning detail), or the answer ends. So the filtered answer's parts come in the
order of the answer's (property-tested in ``tests/unit/test_filters_order.py``). A field that
goes on after another one (an upstream interleaving two tool calls' fragments) keeps matching
where it was: what it said stays said, the rest of a match is masked, and a block still ends the
answer (``core/field_filter.py``, "Flush").

**Input filters** match every text of a request that a model reads (``core/request_texts.py``),
normalized the same way; the first match refuses the request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs

from trio_gateway.core.events import (
    CompletionText,
    Event,
    ReasoningDelta,
    ReasoningDetail,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
)
from trio_gateway.core.field_filter import FieldFilter
from trio_gateway.core.filter_match import FIELDS, Field, FilterSpec, Matcher, Rule, fold
from trio_gateway.core.normalize import normalize
from trio_gateway.core.request_texts import request_texts

# A field of an answer: its name, and which one (a tool call's index; 0 for the others).
_Key = tuple[Field, int]
_CONTENT: _Key = ("content", 0)
_REASONING: _Key = ("reasoning", 0)


@attrs.frozen
class OutputFilters:
    """An alias's output filters, one matcher per field (None: that field is not filtered)."""

    content: Matcher | None = None
    reasoning: Matcher | None = None
    tool_arguments: Matcher | None = None

    def matcher(self, field: Field) -> Matcher | None:
        matcher: Matcher | None = getattr(self, field)
        return matcher


class OutputBlocked(Exception):
    """A ``block`` filter matched: ``events`` may still be said (the text before the match),
    then the answer ends."""

    def __init__(self, rule: Rule, events: list[Event], provider: str | None) -> None:
        super().__init__(rule.name)
        self.rule = rule
        self.events = events
        self.provider = provider


class StreamFilter:
    """One answer's events through its alias's output filters: each field of the answer (the
    content, the reasoning, each tool call's arguments, each choice of a completion) has its own
    :class:`FieldFilter`. ``ResponseStarted`` waits for the first event said after it, so that a
    block before anything of the answer was said leaves nothing said at all."""

    __slots__ = (
        "_current",
        "_fields",
        "_filters",
        "_provider",
        "_sent",
        "_start",
        "_tool_out",
        "matched",
    )

    def __init__(self, filters: OutputFilters) -> None:
        self._filters = filters
        self._fields: dict[_Key, FieldFilter | None] = {}
        self._tool_out: dict[int, list[str]] = {}
        self._current: _Key | None = None  # the field the last event went to
        self._start: ResponseStarted | None = None
        self._sent = False
        self._provider: str | None = None
        # Every occurrence acted on, in order (the caller counts and clears them).
        self.matched: list[Rule] = []

    def _field(self, key: _Key) -> FieldFilter | None:
        try:
            return self._fields[key]
        except KeyError:
            matcher = self._filters.matcher(key[0])
            one = None if matcher is None else FieldFilter(matcher, self.matched)
            self._fields[key] = one
            return one

    def events(self, events: Sequence[Event]) -> list[Event]:
        """What of ``events`` may be said now; raises :class:`OutputBlocked` on a block."""
        out: list[Event] = []
        for event in events:
            kind = type(event)
            if kind is TextDelta or kind is ReasoningDelta:
                assert isinstance(event, TextDelta | ReasoningDelta)
                key = _CONTENT if kind is TextDelta else _REASONING
                if self._current is not key:
                    self._switch(key, out)
                field = self._field(key)
                if field is None:
                    out.append(event)
                    continue
                text = field.feed(event.text)
                if text:
                    out.append(TextDelta(text) if kind is TextDelta else ReasoningDelta(text))
                self._check(field, out)
            elif kind is ToolCallDelta:
                assert isinstance(event, ToolCallDelta)
                self._switch(("tool_arguments", event.index), out)
                self._tool_delta(event, out)
            elif kind is ToolCallDone:
                assert isinstance(event, ToolCallDone)
                self._switch(("tool_arguments", event.index), out)
                out.append(self._tool_done(event, out))
                self._current = None
            elif kind is ReasoningDetail:
                assert isinstance(event, ReasoningDetail)
                self._switch(None, out)  # a block of its own, after what came before it
                out.append(self._detail(event, out))
            elif kind is CompletionText:
                assert isinstance(event, CompletionText)
                self._completion(event, out)
            elif kind is ResponseDone:
                self._switch(None, out)
                self._close_all(out)
                out.append(event)
            elif kind is ResponseStarted and not self._sent:
                assert isinstance(event, ResponseStarted)
                self._start = event
                self._provider = event.provider
            else:
                out.append(event)
        if out:
            self._said(out)
        return out

    def _switch(self, key: _Key | None, out: list[Event]) -> None:
        """The answer goes on in ``key`` (None: in no field): the field it leaves cannot go on
        now, so what that field holds is said, before anything of the next."""
        current = self._current
        if current == key:
            return
        self._current = key
        field = None if current is None else self._fields.get(current)
        if field is None or current is None:
            return
        text = field.flush()
        name, index = current
        if name == "tool_arguments":
            self._tool_out.setdefault(index, []).append(text)
            if text:
                out.append(ToolCallDelta(index, None, None, text))
        elif text:
            out.append(TextDelta(text) if name == "content" else ReasoningDelta(text))
        self._check(field, out)

    def _said(self, out: list[Event]) -> None:
        if self._start is not None:
            out.insert(0, self._start)
            self._start = None
        self._sent = True

    def _check(self, field: FieldFilter, out: list[Event]) -> None:
        rule = field.blocked
        if rule is None:
            return
        if out:
            self._said(out)
        raise OutputBlocked(rule, out, self._provider)

    def _tool_delta(self, event: ToolCallDelta, out: list[Event]) -> None:
        field = self._field(("tool_arguments", event.index))
        if field is None:
            out.append(event)
            return
        args = field.feed(event.arguments)
        self._tool_out.setdefault(event.index, []).append(args)
        if args or event.id is not None or event.name is not None:
            out.append(ToolCallDelta(event.index, event.id, event.name, args))
        self._check(field, out)

    def _tool_done(self, event: ToolCallDone, out: list[Event]) -> Event:
        field = self._field(("tool_arguments", event.index))
        if field is None:
            return event
        if field.fed:
            rest = field.close()
            if rest:
                out.append(ToolCallDelta(event.index, None, None, rest))
            self._tool_out.setdefault(event.index, []).append(rest)
        else:
            # No deltas came for this call: its whole arguments at once.
            self._tool_out[event.index] = [field.feed(event.arguments_raw), field.close()]
        self._check(field, out)
        raw = "".join(self._tool_out.pop(event.index, ()))
        if raw == event.arguments_raw:
            return event
        try:
            parsed, valid = json.loads(raw), True
        except ValueError:
            parsed, valid = raw, False
        return attrs.evolve(event, arguments=parsed, arguments_raw=raw, arguments_valid=valid)

    def _detail(self, event: ReasoningDetail, out: list[Event]) -> Event:
        matcher = self._filters.reasoning
        if matcher is None or event.text is None:
            return event
        # Whole, once: its signature no longer fits a masked text, but nothing filtered leaks.
        field = FieldFilter(matcher, self.matched)
        text = field.feed(event.text) + field.close()
        self._check(field, out)
        return event if text == event.text else attrs.evolve(event, text=text)

    def _completion(self, event: CompletionText, out: list[Event]) -> None:
        field = self._field(("content", event.index))
        if field is None:
            out.append(event)
            return
        text = field.feed(event.text)
        if event.finish_reason is not None:
            text += field.close()
        if field.blocked is not None:
            if text:
                out.append(CompletionText(event.index, text))
            self._check(field, out)
        if text or event.finish_reason is not None:
            out.append(CompletionText(event.index, text, event.finish_reason))

    def _close_all(self, out: list[Event]) -> None:
        """The answer is over: every field still holding text says it (only the last one can:
        the others said theirs when the answer left them)."""
        for (name, _), field in list(self._fields.items()):
            if field is None or name == "tool_arguments":
                continue  # a tool call's arguments end with its ToolCallDone
            text = field.close()
            if text:
                if name == "content":
                    out.append(TextDelta(text))
                else:
                    out.append(ReasoningDelta(text))
            self._check(field, out)


def input_match(matcher: Matcher, body: Mapping[str, object]) -> Rule | None:
    """The first filter that matches any text of the request a model reads, if one does
    (each text normalized as the output's are: ``core/normalize.py``)."""
    for text in request_texts(body):
        rule = _first_match(matcher, normalize(text))
        if rule is not None:
            return rule
    return None


def _first_match(matcher: Matcher, text: str) -> Rule | None:
    """The filter of the match that starts first in ``text`` (already normalized)."""
    found: list[tuple[int, int, int]] = []
    first: tuple[int, int] | None = None  # (start, rule)
    for automaton, rule_of, hay in (
        (matcher.folded, matcher.folded_rule, fold(text) if matcher.folded else ""),
        (matcher.exact, matcher.exact_rule, text),
    ):
        if automaton is None:
            continue
        found.clear()
        automaton.scan(0, hay, 0, found)
        for start, _, pid in found:
            if first is None or (start, rule_of[pid]) < first:
                first = (start, rule_of[pid])
    for regex in matcher.regexes:
        m = regex.pattern.search(text)
        if m is not None and (first is None or (m.start(), regex.rule) < first):
            first = (m.start(), regex.rule)
    return None if first is None else matcher.rules[first[1]]


@attrs.frozen
class AliasFilters:
    """What one alias filters: its answers' fields, and its requests."""

    output: OutputFilters | None = None
    input: Matcher | None = None


NO_FILTERS = AliasFilters()


def alias_filters(output: Sequence[FilterSpec], input: Sequence[FilterSpec]) -> AliasFilters:
    """Compiled once per alias (at start and at each reload), shared by its requests."""
    out: OutputFilters | None = None
    if output:
        fields = {field: [s for s in output if field in s.applies_to] for field in FIELDS}
        out = OutputFilters(
            **{name: Matcher(specs) if specs else None for name, specs in fields.items()}
        )
    return AliasFilters(output=out, input=Matcher(input) if input else None)
