"""Tool calls whose fragments interleave (``index`` 0, 1, 0, 1 …, which the Chat Completions
stream allows) through the Messages front and the Responses front, in any order: the Messages
front writes one whole ``tool_use`` block per call (Anthropic's grammar has one open block at a
time), the Responses front one ``function_call`` item per call (its deltas name their item).
Judged by the SDKs' own accumulators: the anthropic SDK's ``accumulate_event``, the openai
SDK's ``ResponseStreamState``."""

from __future__ import annotations

import itertools
import json
from typing import Any

import attrs
from anthropic.types import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_messages_front import builder, sdk_fold, stream_of, whole
from tests.unit.test_responses_events import judge, run
from trio_gateway.core.events import (
    Event,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)


@attrs.frozen
class Call:
    index: int
    id: str
    name: str
    arguments: Any
    fragments: tuple[ToolCallDelta, ...]


def call_of(index: int, arguments: Any, cuts: list[int]) -> Call:
    raw = json.dumps(arguments, ensure_ascii=False)
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(raw)), len(raw)]
    pieces = [raw[a:b] for a, b in itertools.pairwise(bounds)]
    call_id, name = f"toolu_{index}", f"tool_{index}"
    # The first fragment names the call (vLLM's: no arguments in it), as every dialect does.
    first = ToolCallDelta(index, call_id, name, "")
    rest = tuple(ToolCallDelta(index, None, None, piece) for piece in pieces)
    return Call(index, call_id, name, arguments, (first, *rest))


def answer(calls: list[Call], order: list[int], *, text: str = "") -> list[Event]:
    """The events of an answer whose calls' fragments come in ``order`` (a call index per
    fragment), each call's own fragments in their order; the ending as every dialect writes it."""
    queues: dict[int, list[Event]] = {call.index: list(call.fragments) for call in calls}
    # -1 in the order: a piece of text, numbered.
    queues[-1] = [TextDelta(f"<{n}>") for n in range(order.count(-1))]
    events: list[Event] = [ResponseStarted("p")]
    if text:
        events.append(TextDelta(text))
    events += [queues[i].pop(0) for i in order]
    for call in sorted(calls, key=lambda c: c.index):
        raw = json.dumps(call.arguments, ensure_ascii=False)
        events.append(ToolCallDone(call.index, call.id, call.name, call.arguments, raw, True))
    return [*events, Usage(30, 12), ResponseDone("tool_calls")]


def alternating(calls: list[Call]) -> list[int]:
    """0, 1, 0, 1 …: one fragment of each call in turn, as long as each has some left."""
    left = {call.index: len(call.fragments) for call in calls}
    order: list[int] = []
    while any(left.values()):
        for index in sorted(left):
            if left[index]:
                order.append(index)
                left[index] -= 1
    return order


CITY = {"city": "Paris", "unit": "celsius"}
TIME = {"tz": "Europe/Paris"}
TWO = [call_of(0, CITY, [3, 9, 14, 20, 30]), call_of(1, TIME, [2, 7, 12])]


def messages_blocks(events: list[Event]) -> list[dict[str, Any]]:
    """The whole answer's content, after checking that the streamed answer, folded by the
    anthropic SDK, is the same message."""
    stream = stream_of(events)
    message = Message.model_validate(whole(events))
    assert sdk_fold(stream) == message.model_dump(exclude_none=True)
    starts = [e for e in stream if e["type"] == "content_block_start"]
    assert [e["index"] for e in starts] == list(range(len(starts)))
    return [block.model_dump() for block in message.content]


def test_two_alternating_calls_are_two_whole_tool_use_blocks() -> None:
    """The issue's case: before, 11 blocks, the first two without input, the rest nameless."""
    events = answer(TWO, alternating(TWO), text="Looking both up.")
    blocks = messages_blocks(events)
    assert [b["type"] for b in blocks] == ["text", "tool_use", "tool_use"]
    assert [(b["id"], b["name"], b["input"]) for b in blocks[1:]] == [
        ("toolu_0", "tool_0", CITY),
        ("toolu_1", "tool_1", TIME),
    ]


def test_sequential_calls_still_stream_each_as_it_comes() -> None:
    """A call whose arguments closed their object is whole: the next call's block opens at its
    first fragment, and each fragment is written as it comes, not at the answer's end."""
    order = [0] * len(TWO[0].fragments) + [1] * len(TWO[1].fragments)
    events = answer(TWO, order)
    made = builder()
    written = [made.feed(event) for event in events]
    for event, out in zip(events, written, strict=True):
        if isinstance(event, ToolCallDelta) and event.arguments:
            assert out[-1]["delta"] == {"type": "input_json_delta", "partial_json": event.arguments}
    second = events.index(TWO[1].fragments[0])
    assert [e["type"] for e in written[second]] == ["content_block_stop", "content_block_start"]
    assert messages_blocks(events)[1]["input"] == TIME


def test_interleaved_calls_are_written_once_the_open_one_closes() -> None:
    """What waits behind a call is written when that call's arguments close their object,
    not only at the answer's end."""
    order = alternating(TWO)
    events = answer(TWO, order)
    made = builder()
    written = [made.feed(event) for event in events]
    closing = max(i for i, e in enumerate(events) if e in TWO[0].fragments)
    kinds = [e["type"] for e in written[closing]]
    assert kinds[:3] == ["content_block_delta", "content_block_stop", "content_block_start"]
    # Nothing was left for the end: the ending closes the second call's block, and ends.
    assert [e["type"] for e in [x for out in written[closing + 1 :] for x in out]] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_text_after_an_unfinished_call_waits_for_it() -> None:
    """Anthropic's blocks come one at a time: text that arrives while a call's arguments are
    still open is written after that call's block, not inside it nor as a second block of it."""
    call = call_of(0, CITY, [5])
    first, name_only, tail = call.fragments[0], call.fragments[1], call.fragments[2]
    events: list[Event] = [
        ResponseStarted("p"),
        first,
        name_only,
        TextDelta("meanwhile"),
        tail,
        ToolCallDone(0, call.id, call.name, CITY, json.dumps(CITY), True),
        ResponseDone("tool_calls"),
    ]
    blocks = messages_blocks(events)
    assert [b["type"] for b in blocks] == ["tool_use", "text"]
    assert blocks[0]["input"] == CITY and blocks[1]["text"] == "meanwhile"


_json_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=6)
_values = st.one_of(_json_text, st.integers(), st.lists(st.booleans(), max_size=2))
_arguments = st.dictionaries(_json_text, _values, max_size=3)


@st.composite
def interleavings(draw: st.DrawFn) -> tuple[list[Call], list[int]]:
    count = draw(st.integers(1, 4))
    calls = [
        call_of(i, draw(_arguments), draw(st.lists(st.integers(1, 40), max_size=6)))
        for i in range(count)
    ]
    texts = draw(st.integers(0, 3))
    order = draw(st.permutations([c.index for c in calls for _ in c.fragments] + [-1] * texts))
    return calls, list(order)


# Bounded for a loaded 2-core machine: the SDKs' strict models check every event (the
# Responses stream's far more per answer, so it gets fewer answers).
_SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_FEWER = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(interleavings(), st.sampled_from(["", "Calling."]))
def test_any_interleaving_is_one_tool_use_block_per_call(
    drawn: tuple[list[Call], list[int]], text: str
) -> None:
    """Text among the fragments (-1 in the order) is written in its order, never inside a
    call's block."""
    calls, order = drawn
    blocks = messages_blocks(answer(calls, order, text=text))
    tool_blocks = [b for b in blocks if b["type"] == "tool_use"]
    # A call's block opens where its first fragment came.
    first_seen = [i for i in dict.fromkeys(order) if i >= 0]
    assert [(b["id"], b["name"], b["input"]) for b in tool_blocks] == [
        (calls[i].id, calls[i].name, calls[i].arguments) for i in first_seen
    ]
    said = "".join(b["text"] for b in blocks if b["type"] == "text")
    assert said == text + "".join(f"<{n}>" for n in range(order.count(-1)))


@_FEWER
@given(interleavings())
def test_any_interleaving_is_one_function_call_item_per_call(
    drawn: tuple[list[Call], list[int]],
) -> None:
    """The Responses stream may interleave: each delta names its item by ``output_index``, and
    the openai SDK's state machine folds them so (its items stay open until their ``done``)."""
    calls, order = drawn
    events, result = run(answer(calls, order))
    final = judge(events)
    assert events[-1]["response"] == result
    first_seen = [i for i in dict.fromkeys(order) if i >= 0]
    items = [o for o in final.output if o.type == "function_call"]
    assert [(o.call_id, o.name, json.loads(o.arguments)) for o in items] == [
        (calls[i].id, calls[i].name, calls[i].arguments) for i in first_seen
    ]
    said = "".join(o.content[0].text for o in final.output if o.type == "message")
    assert said == "".join(f"<{n}>" for n in range(order.count(-1)))
    assert {item["status"] for item in result["output"]} == {"completed"}
