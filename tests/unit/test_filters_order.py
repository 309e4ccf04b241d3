"""Output filters keep the order of an answer's parts (issue 40, item 3; core/filters.py,
"Order"): a field's held text is said as soon as the answer leaves that field, so the filtered
answer's fields come in the unfiltered answer's order, for any answer cut into any events and
any batches of them; and what a field said when the answer left it is its text masked whole."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.core.events import (
    Event,
    ReasoningDelta,
    ReasoningDetail,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.field_filter import mask_whole
from trio_gateway.core.filter_match import FilterSpec, Matcher
from trio_gateway.core.filters import OutputBlocked, StreamFilter, alias_filters

SECRETS = FilterSpec(name="s", patterns=("project-falcon", "ab"), regex=(r"\d{3}",), mask="[m]")
ALPHABET = "abp project-falcon 12 \u0301\u200b"


def field_of(event: Event) -> str | None:
    if isinstance(event, TextDelta):
        return "content"
    if isinstance(event, ReasoningDelta):
        return "reasoning"
    if isinstance(event, ToolCallDelta | ToolCallDone):
        return f"tool {event.index}"
    if isinstance(event, ReasoningDetail):
        return "detail"
    return None


def order(events: list[Event]) -> list[str]:
    """The fields of an answer in the order they come, a run of one field counted once."""
    fields: list[str] = []
    for event in events:
        field = field_of(event)
        if field is not None and (not fields or fields[-1] != field):
            fields.append(field)
    return fields


def run(filtered: StreamFilter, batches: list[list[Event]]) -> tuple[list[Event], bool]:
    out: list[Event] = []
    for batch in batches:
        try:
            out.extend(filtered.events(batch))
        except OutputBlocked as blocked:
            return out + blocked.events, True
    return out, False


def stream(*specs: FilterSpec) -> StreamFilter:
    filters = alias_filters(specs, ()).output
    assert filters is not None
    return StreamFilter(filters)


def test_reasoning_then_a_tool_call_keeps_its_order() -> None:
    """The issue's case: "look u" + "p" (held for project-falcon), then a tool call."""
    one = stream(FilterSpec(name="secrets", patterns=("project-falcon",)))
    out = one.events(
        [
            ResponseStarted("p"),
            ReasoningDelta("look"),
            ReasoningDelta(" up"),
            ToolCallDelta(0, "c0", "save", '{"a": 1}'),
        ]
    )
    assert out == [
        ResponseStarted("p"),
        ReasoningDelta("loo"),  # the k waits for a possible accent
        ReasoningDelta("k u"),
        ReasoningDelta("p"),
        ToolCallDelta(0, "c0", "save", '{"a": 1}'),
    ]


def test_each_field_says_what_it_holds_when_the_next_begins() -> None:
    one = stream(SECRETS)
    events: list[Event] = [
        ResponseStarted("p"),
        ReasoningDelta("think pro"),
        ReasoningDetail(0, "anthropic", text="think pro", signature="sig"),
        TextDelta("answer 12"),
        ToolCallDelta(0, "c0", "f", '{"x": "a'),
        ToolCallDelta(1, "c1", "g", '{"y": "1'),
        ToolCallDone(0, "c0", "f", {"x": "a"}, '{"x": "a', False),
        ToolCallDone(1, "c1", "g", {"y": "1"}, '{"y": "1', False),
        ResponseDone("tool_calls"),
    ]
    out = one.events(events)
    assert order(out) == order(events)
    assert out[1:4] == [
        ReasoningDelta("think "),
        ReasoningDelta("pro"),
        ReasoningDetail(0, "anthropic", text="think pro", signature="sig"),
    ]


def test_a_block_in_a_field_the_answer_left_is_still_found() -> None:
    """A field said what it held when another began; the word it began, once finished, is
    still a block (the match goes on where it was)."""
    one = stream(FilterSpec(name="stop", patterns=("halt",), action="block"))
    out = one.events([ResponseStarted("p"), ToolCallDelta(0, "c0", "f", "ha")])
    assert out == [ResponseStarted("p"), ToolCallDelta(0, "c0", "f", "")]
    assert one.events([ToolCallDelta(1, "c1", "g", "1")]) == [
        ToolCallDelta(0, None, None, "ha"),
        ToolCallDelta(1, "c1", "g", "1"),
    ]
    said, blocked = run(one, [[ToolCallDelta(0, None, None, "lt"), ResponseDone("stop")]])
    assert blocked
    assert said == []


@st.composite
def answers(draw: st.DrawFn) -> list[Event]:
    """An answer cut into any events: runs of fields in any order, each run's text cut into
    any deltas, then the calls' ends and the answer's."""
    events: list[Event] = [ResponseStarted("p")]
    calls: dict[int, str] = {}
    for _ in range(draw(st.integers(1, 6))):
        field = draw(st.sampled_from(["content", "reasoning", "tool 0", "tool 1", "detail"]))
        text = draw(st.text(ALPHABET, min_size=1, max_size=12))
        if field == "detail":
            events.append(ReasoningDetail(0, "anthropic", text=text, signature="sig"))
            continue
        cuts = sorted(set(draw(st.lists(st.integers(1, len(text)), max_size=4))) | {len(text)})
        start = 0
        for cut in cuts:
            piece = text[start:cut]
            start = cut
            if field == "content":
                events.append(TextDelta(piece))
            elif field == "reasoning":
                events.append(ReasoningDelta(piece))
            else:
                index = int(field[-1])
                first = index not in calls
                calls[index] = calls.get(index, "") + piece
                name = f"f{index}" if first else None
                events.append(ToolCallDelta(index, f"c{index}" if first else None, name, piece))
    for index in sorted(calls):
        raw = calls[index]
        events.append(ToolCallDone(index, f"c{index}", f"f{index}", raw, raw, False))
    events += [Usage(1, 2), ResponseDone("stop")]
    return events


def batches(data: st.DataObject, events: list[Event]) -> list[list[Event]]:
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(events)), max_size=6))))
    out = []
    start = 0
    for cut in [*cuts, len(events)]:
        out.append(events[start:cut])
        start = cut
    return out


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_answer_in_any_events_keeps_its_fields_order(data: st.DataObject) -> None:
    events = data.draw(answers())
    block = data.draw(st.booleans())
    specs = [SECRETS]
    if block:
        specs.append(FilterSpec(name="stop", patterns=("falcon",), action="block"))
    filtered = stream(*specs)
    out, blocked = run(filtered, batches(data, events))
    said = order(out)
    if blocked:
        assert said == order(events)[: len(said)]
    else:
        assert said == order(events)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_field_left_has_said_its_text_masked_whole(data: st.DataObject) -> None:
    """The moment the answer leaves a field the first time, all that field said is its text
    so far, masked as the whole would be."""
    events = data.draw(answers())
    matcher = Matcher([SECRETS])
    filtered = stream(SECRETS)
    text: dict[str, str] = {}
    said: dict[str, str] = {}
    left: set[str] = set()
    current: str | None = None
    for event in events:
        field = field_of(event)
        out = filtered.events([event])
        for piece in out:
            name = field_of(piece)
            if isinstance(piece, TextDelta | ReasoningDelta) and name is not None:
                said[name] = said.get(name, "") + piece.text
            elif isinstance(piece, ToolCallDelta) and name is not None:
                said[name] = said.get(name, "") + piece.arguments
        leaves = field is not None or isinstance(event, ResponseDone)
        if leaves and current is not None and field != current and current not in left:
            left.add(current)
            assert said.get(current, "") == mask_whole(matcher, text[current])[0]
        if isinstance(event, TextDelta | ReasoningDelta) and field is not None:
            text[field] = text.get(field, "") + event.text
        elif isinstance(event, ToolCallDelta) and field is not None:
            text[field] = text.get(field, "") + event.arguments
        if field is not None and field != "detail":
            current = field
