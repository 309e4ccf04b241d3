"""Split-safe output filters: the text of a stream, masked or blocked as it passes, whatever the
cuts between its pieces. Pure; ``core/filter_match.py`` finds the matches.

**What the client gets** (the reference, :func:`mask_whole` on the whole text): every occurrence
of every pattern and every regex match (``re.finditer``'s, per regex) is found, overlapping ones
included. Taken by start (a ``block`` first, then the longest, then the filter listed first), each
occurrence that starts outside the characters already masked is replaced by its filter's mask, and
the characters it covers are gone; one that starts inside them only extends them (overlapping
occurrences make one mask). The first ``block`` occurrence ends the text at its start: what comes
before it is said, masked as above, and nothing of it or after it.

**Streaming** (:class:`FieldFilter`): text is said as soon as no occurrence not yet seen could
cover it. An occurrence not yet complete starts in the text's last ``hold`` characters (the
automaton's longest suffix that may still grow into a match), or, for a regex, at a start not
yet decided (less than its reach before the end); so at most the longest possible match minus one
character is held back (:attr:`Matcher.window`), and an occurrence is masked before any of its
characters is said. Literal-only filters hold back nothing while the text cannot begin a match;
a regex holds back its reach (Python's ``re`` cannot say whether a text could still begin a match).

Every split of a text into pieces gives the same output as the whole (property-tested in
``tests/unit/test_filters_property.py``). Text reaches this module as ``str``: the SSE decoder
(``core/sse.py``) cuts the byte stream only at line ends, so a multi-byte UTF-8 character is never
seen in halves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence

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
from trio_gateway.core.filter_match import FIELDS, Field, FilterSpec, Matcher, Rule, fold

# (start, 0 for a block else 1, -length, rule, end): sorted, the order the reference takes them.
_Occurrence = tuple[int, int, int, int, int]


class FieldFilter:
    """One field of one stream (the content, the reasoning, one tool call's arguments)."""

    __slots__ = (
        "_base",
        "_buf",
        "_emit",
        "_exact_state",
        "_folded_state",
        "_known",
        "_mask_until",
        "_matched",
        "_matcher",
        "_n",
        "_q",
        "blocked",
    )

    def __init__(self, matcher: Matcher, matched: list[Rule] | None = None) -> None:
        self._matcher = matcher
        self._buf = ""
        self._base = 0  # where _buf starts in the whole text
        self._n = 0  # characters fed
        self._emit = 0  # characters decided (said, masked or dropped)
        self._mask_until = 0  # the characters before this are under a mask already said
        self._folded_state = 0
        self._exact_state = 0
        self._q = [0] * len(matcher.regexes)  # each regex: starts before this are decided
        self._known: list[_Occurrence] = []
        self._matched = matched if matched is not None else []
        self.blocked: Rule | None = None

    @property
    def held(self) -> int:
        """Characters fed and not yet decided."""
        return self._n - self._emit

    @property
    def fed(self) -> int:
        return self._n

    def feed(self, text: str) -> str:
        """The part of the text, masked, that can be said now. After a block, nothing more."""
        if self.blocked is not None or not text:
            return ""
        matcher = self._matcher
        offset = self._n
        self._buf += text
        n = self._n = offset + len(text)
        found: list[tuple[int, int, int]] = []
        hold = 0
        if matcher.folded is not None:
            automaton = matcher.folded
            state = self._folded_state = automaton.scan(
                self._folded_state, fold(text), offset, found
            )
            hold = automaton.hold[state]
            self._add(found, matcher.folded_rule)
        if matcher.exact is not None:
            automaton = matcher.exact
            found.clear()
            state = self._exact_state = automaton.scan(self._exact_state, text, offset, found)
            hold = max(hold, automaton.hold[state])
            self._add(found, matcher.exact_rule)
        cut = n - hold
        if matcher.regexes:
            cut = min(cut, self._regexes(final=False))
        return self._render(cut)

    def close(self) -> str:
        """The end of the field's text: the rest, masked."""
        if self.blocked is not None:
            return ""
        if self._matcher.regexes:
            self._regexes(final=True)
        return self._render(self._n)

    def _add(self, found: list[tuple[int, int, int]], rule_of: tuple[int, ...]) -> None:
        rules = self._matcher.rules
        for start, end, pid in found:
            rule = rules[rule_of[pid]]
            self._known.append(
                (start, 0 if rule.action == "block" else 1, start - end, rule.index, end)
            )

    def _regexes(self, *, final: bool) -> int:
        """Runs each regex over the starts now decidable; the first undecided start."""
        buf, base, n = self._buf, self._base, self._n
        rules = self._matcher.rules
        lowest = n
        for i, regex in enumerate(self._matcher.regexes):
            q = self._q[i]
            bound = n if final else n - regex.reach
            search = regex.pattern.search
            while q <= bound:
                m = search(buf, q - base)
                if m is None or m.start() + base > bound:
                    q = bound + 1
                    break
                start, end = m.start() + base, m.end() + base
                rule = rules[regex.rule]
                self._known.append(
                    (start, 0 if rule.action == "block" else 1, start - end, rule.index, end)
                )
                q = end
            self._q[i] = q
            lowest = min(lowest, q)
        return lowest

    def _render(self, cut: int) -> str:
        """Says the text up to ``cut``, whose every occurrence is known by now."""
        out: list[str] = []
        buf, base = self._buf, self._base
        mask_until = self._mask_until
        p = max(self._emit, mask_until)
        known = self._known
        if known:
            known.sort()
            rules = self._matcher.rules
            taken = 0
            for start, _, _, index, end in known:
                if start >= cut:
                    break
                taken += 1
                rule = rules[index]
                self._matched.append(rule)
                if start < mask_until:
                    if rule.action == "block":
                        return self._block(rule, start, out)
                    mask_until = max(mask_until, end)
                    p = max(p, mask_until)
                    continue
                if p < start:
                    out.append(buf[p - base : start - base])
                if rule.action == "block":
                    return self._block(rule, start, out)
                out.append(rule.mask)
                mask_until = p = end
            del known[:taken]
        if p < cut:
            out.append(buf[p - base : cut - base])
        self._emit = cut
        self._mask_until = mask_until
        keep = cut
        if self._q:
            keep = min(keep, min(self._q) - self._matcher.context)
        if keep > base:
            self._buf = buf[keep - base :]
            self._base = keep
        return "".join(out)

    def _block(self, rule: Rule, start: int, out: list[str]) -> str:
        self.blocked = rule
        self._emit = start
        self._known.clear()
        self._buf = ""
        return "".join(out)


def mask_whole(matcher: Matcher, text: str) -> tuple[str, Rule | None]:
    """The reference: ``text`` masked whole, and the block that ended it if one did."""
    field = FieldFilter(matcher)
    out = field.feed(text) + field.close()
    return out, field.blocked


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

    __slots__ = ("_fields", "_filters", "_provider", "_sent", "_start", "_tool_out", "matched")

    def __init__(self, filters: OutputFilters) -> None:
        self._filters = filters
        self._fields: dict[tuple[Field, int], FieldFilter | None] = {}
        self._tool_out: dict[int, list[str]] = {}
        self._start: ResponseStarted | None = None
        self._sent = False
        self._provider: str | None = None
        # Every occurrence acted on, in order (the caller counts and clears them).
        self.matched: list[Rule] = []

    def _field(self, field: Field, index: int) -> FieldFilter | None:
        key = (field, index)
        try:
            return self._fields[key]
        except KeyError:
            matcher = self._filters.matcher(field)
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
                field = self._field("content" if kind is TextDelta else "reasoning", 0)
                if field is None:
                    out.append(event)
                    continue
                text = field.feed(event.text)
                if text:
                    out.append(TextDelta(text) if kind is TextDelta else ReasoningDelta(text))
                self._check(field, out)
            elif kind is ToolCallDelta:
                assert isinstance(event, ToolCallDelta)
                self._tool_delta(event, out)
            elif kind is ToolCallDone:
                assert isinstance(event, ToolCallDone)
                out.append(self._tool_done(event, out))
            elif kind is ReasoningDetail:
                assert isinstance(event, ReasoningDetail)
                out.append(self._detail(event, out))
            elif kind is CompletionText:
                assert isinstance(event, CompletionText)
                self._completion(event, out)
            elif kind is ResponseDone:
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
        field = self._field("tool_arguments", event.index)
        if field is None:
            out.append(event)
            return
        args = field.feed(event.arguments)
        self._tool_out.setdefault(event.index, []).append(args)
        if args or event.id is not None or event.name is not None:
            out.append(ToolCallDelta(event.index, event.id, event.name, args))
        self._check(field, out)

    def _tool_done(self, event: ToolCallDone, out: list[Event]) -> Event:
        field = self._field("tool_arguments", event.index)
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
        field = self._field("content", event.index)
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
        """The answer is over: every field still holding text says it."""
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


def request_texts(body: Mapping[str, object]) -> Iterator[str]:
    """Every text a client sent in a request body (chat-shaped, or a completion's prompt, or
    embeddings' input): what input filters read."""
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"]
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                yield function["arguments"]
    for key in ("prompt", "input"):
        value = body.get(key)
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            yield from (v for v in value if isinstance(v, str))


def input_match(matcher: Matcher, body: Mapping[str, object]) -> Rule | None:
    """The first filter that matches any text of the request, if one does."""
    for text in request_texts(body):
        matched: list[Rule] = []
        field = FieldFilter(matcher, matched)
        field.feed(text)
        field.close()
        if matched or field.blocked is not None:
            return field.blocked or matched[0]
    return None


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
