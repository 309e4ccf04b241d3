"""Ending an answer at its first complete tool call (``toolcall_stop.py``), and the provider
shell closing the upstream when it does (``providers/upstream.py``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from tests.h1_mock import HandlerStream
from tests.unit.fixtures import transcript
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.events import (
    Event,
    ReasoningDelta,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.sse import SSEDecoder, SSEEvent
from trio_gateway.http1.client import Origin
from trio_gateway.providers.gemini.dialect import GeminiDialect
from trio_gateway.providers.openai.dialect import OpenAIDialect
from trio_gateway.providers.openai_compatible.dialect import ChunkParser, OpenAICompatibleDialect
from trio_gateway.providers.toolcall_stop import FirstToolCallOnly, ObjectEnd
from trio_gateway.providers.upstream import Upstream

# --- ObjectEnd: is the first call's argument object closed? ---------------------------------


def closed_at(fragments: list[str]) -> int | None:
    """The index of the fragment at which the object closed, if it did."""
    scanner = ObjectEnd()
    for i, fragment in enumerate(fragments):
        if scanner.feed(fragment):
            return i
    return None


@pytest.mark.parametrize(
    ("fragments", "expected"),
    [
        (["{}"], 0),
        (["{", "}"], 1),
        (["", "{", "", "}"], 3),
        ([" \n\t{", '"a"', ": 1", "}"], 3),
        (['{"city": "Par', 'is"}'], 1),
        # Braces and brackets inside strings are text.
        (['{"a": "}"', "}"], 1),
        (['{"a": "{[]}"}'], 0),
        (['{"a": "}', "{", '"}'], 2),
        # Escaped quotes do not end a string; an escaped backslash does not escape the quote.
        (['{"a": "\\"}"', "}"], 1),
        (['{"a": "\\\\"', "}"], 1),
        (['{"a": "\\\\\\"}"}'], 0),
        # An escape cut between fragments: the quote after it is still escaped.
        (['{"a": "x\\', '"', '}"}'], 2),
        (['{"a": "x\\', '\\"', "}"], 2),
        (['{"a": "\\', "u007d", '"}'], 2),
        # Nesting: the object closes at its own brace, not an inner one.
        (['{"a": {"b": [1, {"c": []}]}', "}"], 1),
        (['{"a": [', "{}", ", []", "]", "}"], 4),
        (['{"a": [[[[', "]]]]}"], 1),
        # Whatever follows the closing brace in the same fragment is the fragment's business.
        (["{}}"], 0),
        (['{"a": 1} '], 0),
    ],
)
def test_object_end_table(fragments: list[str], expected: int | None) -> None:
    assert closed_at(fragments) == expected


@pytest.mark.parametrize(
    "fragments",
    [
        ["[1, 2]"],  # an array is not an object
        ['"text"'],
        ["x{}"],
        ["null"],
        ["1", "{}"],
        ['{"a": [}'],  # brackets that do not match
        ['{"a": {]}'],
    ],
)
def test_object_end_gives_up_on_what_is_not_an_object(fragments: list[str]) -> None:
    scanner = ObjectEnd()
    assert [scanner.feed(f) for f in fragments] == [False] * len(fragments)
    assert scanner.gave_up
    assert not scanner.feed("}") and not scanner.feed("{}")


def test_object_end_stays_closed_and_open_ones_stay_open() -> None:
    scanner = ObjectEnd()
    assert not scanner.feed('{"a": "b"')
    assert not scanner.gave_up and not scanner.closed
    assert scanner.feed("}")
    assert scanner.feed("") and scanner.feed("garbage") and scanner.closed


# Text that tests the scanner: braces, brackets, quotes, backslashes, control characters (JSON
# escapes them), non-ASCII (escaped or not).
AWKWARD_TEXT = st.text(
    alphabet=st.sampled_from('ab {}[]":,\\/\n\t\x00\x1féπ中😀\u2028'), max_size=12
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | AWKWARD_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(AWKWARD_TEXT, inner, max_size=4),
    max_leaves=20,
)
JSON_OBJECTS = st.dictionaries(AWKWARD_TEXT, JSON_VALUES, max_size=5)


@given(
    obj=JSON_OBJECTS,
    ensure_ascii=st.booleans(),
    indent=st.sampled_from([None, 0, 2]),
    cuts=st.lists(st.integers(0, 10_000), max_size=30),
)
def test_any_object_in_any_fragments_closes_exactly_at_the_last(
    obj: dict[str, Any], ensure_ascii: bool, indent: int | None, cuts: list[int]
) -> None:
    text = json.dumps(obj, ensure_ascii=ensure_ascii, indent=indent)
    points = sorted({c % len(text) for c in cuts} - {0})
    fragments = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assert "".join(fragments) == text and all(fragments)
    scanner = ObjectEnd()
    assert [scanner.feed(f) for f in fragments] == [False] * (len(fragments) - 1) + [True]


@given(obj=JSON_OBJECTS, ensure_ascii=st.booleans())
def test_one_character_at_a_time_closes_at_the_last(
    obj: dict[str, Any], ensure_ascii: bool
) -> None:
    text = json.dumps(obj, ensure_ascii=ensure_ascii)
    assert closed_at(list(text)) == len(text) - 1


# --- FirstToolCallOnly over the vLLM dialect's parser ----------------------------------------


def data(
    *,
    calls: list[dict[str, Any]] | None = None,
    content: str | None = None,
    reasoning: str | None = None,
    finish: str | None = None,
    completion: int | None = None,
) -> SSEEvent:
    """One vLLM chunk; ``completion`` adds continuous usage stats (prompt: 10 tokens)."""
    delta: dict[str, Any] = {}
    if calls is not None:
        delta["tool_calls"] = calls
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning"] = reasoning
    chunk: dict[str, Any] = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if completion is not None:
        chunk["usage"] = {
            "prompt_tokens": 10,
            "completion_tokens": completion,
            "total_tokens": 10 + completion,
        }
    return SSEEvent(data=json.dumps(chunk).encode())


def first(index: int, name: str) -> dict[str, Any]:
    return {"index": index, "id": f"call-{index}", "type": "function", "function": {"name": name}}


def args(index: int, text: str) -> dict[str, Any]:
    return {"index": index, "function": {"arguments": text}}


def two_calls(*, usage: bool = True) -> list[SSEEvent]:
    pieces = [
        [first(0, "get_weather")],
        [args(0, '{"city"')],
        [args(0, ': "P{a}r')],
        [args(0, 'is"}')],  # the first call is whole here (chunk 3)
        [first(1, "get_time")],
        [args(1, '{"tz": "UTC"}')],
    ]
    events = [
        data(calls=calls, completion=i + 1 if usage else None) for i, calls in enumerate(pieces)
    ]
    events.append(data(finish="tool_calls", completion=7 if usage else None))
    events.append(SSEEvent(data=b"[DONE]"))
    return events


def run(parser: FirstToolCallOnly, events: list[SSEEvent]) -> tuple[list[Event], int]:
    """Feed until the parser is done, as the shell does; the events, and the chunks read."""
    out: list[Event] = []
    for read, event in enumerate(events, start=1):
        out += parser.feed(event)
        if parser.done:
            return out + parser.close(), read
    return out + parser.close(), len(events)


WEATHER_DONE = ToolCallDone(
    0, "call-0", "get_weather", {"city": "P{a}ris"}, '{"city": "P{a}ris"}', True
)


def test_stops_where_the_first_calls_arguments_close() -> None:
    parser = FirstToolCallOnly(ChunkParser("vllm"))
    out, read = run(parser, two_calls())
    assert read == 4
    assert parser.stopped and parser.done
    deltas = [e for e in out if isinstance(e, ToolCallDelta)]
    assert {d.index for d in deltas} == {0}
    assert out[0] == ResponseStarted(provider="vllm")
    assert out[-3:] == [WEATHER_DONE, Usage(10, 4), ResponseDone("tool_calls")]
    # The ending is handed on once.
    assert parser.close() == []


def test_the_second_calls_first_fragment_ends_a_call_whose_arguments_never_close() -> None:
    events = [
        data(calls=[first(0, "f")], completion=1),
        data(calls=[args(0, '"not an object"')], completion=2),
        data(calls=[first(1, "g")], completion=3),
        data(calls=[args(1, "{}")], completion=4),
        data(finish="tool_calls", completion=5),
    ]
    parser = FirstToolCallOnly(ChunkParser("vllm"))
    out, read = run(parser, events)
    assert read == 3
    assert not any(isinstance(e, ToolCallDelta) and e.index == 1 for e in out)
    done = ToolCallDone(0, "call-0", "f", "not an object", '"not an object"', True)
    assert out[-3:] == [done, Usage(10, 3), ResponseDone("tool_calls")]


def test_a_chunk_holding_the_end_of_one_call_and_the_start_of_the_next_is_cut_between() -> None:
    events = [
        data(calls=[first(0, "f"), args(0, '{"a": ')], completion=1),
        data(calls=[args(0, "[1]}"), first(1, "g"), args(1, "{}")], completion=2),
        data(finish="tool_calls", completion=3),
    ]
    out, read = run(FirstToolCallOnly(ChunkParser("vllm")), events)
    assert read == 2
    assert [e for e in out if isinstance(e, ToolCallDelta)] == [
        ToolCallDelta(0, "call-0", "f", ""),
        ToolCallDelta(0, None, None, '{"a": '),
        ToolCallDelta(0, None, None, "[1]}"),
    ]
    assert out[-3:] == [
        ToolCallDone(0, "call-0", "f", {"a": [1]}, '{"a": [1]}', True),
        Usage(10, 2),
        ResponseDone("tool_calls"),
    ]


def test_an_answer_that_finishes_in_the_closing_chunk_passes_as_it_came() -> None:
    events = [
        data(calls=[first(0, "f")], completion=1),
        data(calls=[args(0, "{}")], finish="tool_calls", completion=2),
        SSEEvent(data=json.dumps({"choices": [], "usage": {"prompt_tokens": 10}}).encode()),
        SSEEvent(data=b"[DONE]"),
    ]
    parser = FirstToolCallOnly(ChunkParser("vllm"))
    out, read = run(parser, events)
    assert read == 4 and not parser.stopped
    plain, _ = run_plain(events)
    assert out == plain


def run_plain(events: list[SSEEvent]) -> tuple[list[Event], ChunkParser]:
    parser = ChunkParser("vllm")
    out: list[Event] = []
    for event in events:
        out += parser.feed(event)
        if parser.done:
            break
    return out, parser


@pytest.mark.parametrize(
    "events",
    [
        # No tool call at all: reasoning and text pass untouched.
        [
            data(reasoning="hm", completion=1),
            data(content="hello", completion=2),
            data(finish="stop", completion=3),
            SSEEvent(data=b"[DONE]"),
        ],
        # One call whose arguments never close: the stream's own end ends it.
        [
            data(calls=[first(0, "f")], completion=1),
            data(calls=[args(0, '{"a": "unfinished')], completion=2),
            data(finish="tool_calls", completion=3),
            SSEEvent(data=b"[DONE]"),
        ],
    ],
    ids=["no-tool-call", "arguments-never-close"],
)
def test_without_a_complete_first_call_nothing_changes(events: list[SSEEvent]) -> None:
    parser = FirstToolCallOnly(ChunkParser("vllm"))
    out, read = run(parser, events)
    assert read == len(events) and not parser.stopped
    assert out == run_plain(events)[0]


def test_reasoning_and_text_before_the_call_pass_through() -> None:
    events = [
        data(reasoning="think", completion=1),
        data(content="let me look", completion=2),
        data(calls=[first(0, "f")], completion=3),
        data(calls=[args(0, "{}")], completion=4),
        data(calls=[first(1, "g")], completion=5),
    ]
    out, read = run(FirstToolCallOnly(ChunkParser("vllm")), events)
    assert read == 4
    assert out[1:3] == [ReasoningDelta("think"), TextDelta("let me look")]
    assert out[-1] == ResponseDone("tool_calls")


def test_an_estimate_is_not_sent_as_the_answers_usage() -> None:
    # Without continuous usage stats the count is an estimate: it stays in the meter (where the
    # usage record marks it estimated), not in a Usage event.
    parser = FirstToolCallOnly(ChunkParser("vllm"))
    out, read = run(parser, two_calls(usage=False))
    assert read == 4
    assert not any(isinstance(e, Usage) for e in out)
    partial = parser.usage_so_far()
    assert partial is not None and partial.estimated
    assert partial.usage.completion_tokens == 4


def test_the_real_vllm_tool_call_transcript_stops_before_its_finish_chunk() -> None:
    _, body = transcript("toolcall_nothink_stream_True.txt")
    events = [e for e in SSEDecoder().feed(body) if e.data]
    parser = FirstToolCallOnly(ChunkParser("vllm"))
    out, read = run(parser, events)
    assert parser.stopped
    assert read == len(events) - 2  # before the finish_reason chunk and [DONE]
    done = [e for e in out if isinstance(e, ToolCallDone)]
    assert [(d.name, d.arguments) for d in done] == [("get_weather", {"city": "x"})]
    assert out[-1] == ResponseDone("tool_calls")


# --- which requests get it ---------------------------------------------------------------------


def provider(**overrides: Any) -> ProviderConfig:
    fields: dict[str, Any] = {
        "name": "p1",
        "type": "openai_compatible",
        "model": "m",
        "base_url": "http://upstream.test/v1",
        "max_inflight": 3,
        "connect_timeout_s": 0.5,
        "first_token_timeout_s": 5.0,
        "idle_timeout_s": 5.0,
    }
    fields.update(overrides)
    return ProviderConfig(**fields)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def request(**fields: Any) -> ChatRequest:
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]}
    return ChatRequest(
        alias="a",
        body={**body, **fields},
        stream=True,
        include_usage=True,
        reasoning=None,
        required=frozenset(),
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"parallel_tool_calls": False}, True),
        ({"parallel_tool_calls": True}, False),
        ({}, False),
        ({"parallel_tool_calls": None}, False),
    ],
)
def test_only_parallel_tool_calls_false_asks_for_the_stop(
    fields: dict[str, Any], expected: bool
) -> None:
    call = OpenAICompatibleDialect().build_call(request(**fields), provider())
    assert call.first_tool_call_only is expected
    # The flag still reaches vLLM, which returns only the first call.
    assert json.loads(call.body).get("parallel_tool_calls") == fields.get("parallel_tool_calls")


def test_openai_itself_honours_the_flag_and_is_not_cut() -> None:
    config = provider(type="openai", base_url=None)
    call = OpenAIDialect().build_call(request(parallel_tool_calls=False), config)
    assert call.first_tool_call_only is False
    assert json.loads(call.body)["parallel_tool_calls"] is False


# --- the shell: the upstream is closed at once, the rest never read --------------------------


class Recorded:
    """The in-memory upstream's side: how many body pieces the gateway pulled, and whether it
    closed the connection."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.pulled = 0
        self.streams: list[HandlerStream] = []

    async def handler(self, request: httpx.Request) -> httpx.Response:
        async def body() -> Any:
            for piece in self.pieces:
                self.pulled += 1
                yield piece

        return httpx.Response(200, stream=body(), headers={"content-type": "text/event-stream"})

    async def connect(self, origin: Origin) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        stream = HandlerStream(self.handler)
        self.streams.append(stream)
        return stream


def wire(events: list[SSEEvent]) -> list[bytes]:
    return [b"data: " + e.data + b"\n\n" for e in events]


async def serve(fields: dict[str, Any]) -> tuple[list[Event], Recorded, Upstream]:
    upstream_side = Recorded(wire(two_calls()))
    client = httpx.AsyncClient()
    upstream = Upstream(provider(), None, client, connect=upstream_side.connect)
    events: list[Event] = []

    async def emit(batch: list[Event]) -> None:
        for event in batch:
            if isinstance(event, ToolCallDone):
                # The upstream is already closed when the ending goes out: a client slow to
                # take it does not keep the GPU generating.
                assert upstream_side.streams[0]._closed is bool(
                    fields.get("parallel_tool_calls") is False
                )
        events.extend(batch)

    await upstream.stream_chat(request(**fields), emit)
    await client.aclose()
    return events, upstream_side, upstream


async def test_the_shell_closes_the_upstream_at_the_first_complete_call() -> None:
    events, upstream_side, upstream = await serve({"parallel_tool_calls": False})
    assert upstream_side.pulled == 4  # nothing read after the closing fragment
    [stream] = upstream_side.streams
    assert stream._closed  # closed, not kept for reuse: what makes vLLM abort
    assert [e for e in events if isinstance(e, ToolCallDone)] == [WEATHER_DONE]
    assert events[-2:] == [Usage(10, 4), ResponseDone("tool_calls")]
    assert upstream.tool_call_early_stops == 1


@pytest.mark.parametrize("fields", [{}, {"parallel_tool_calls": True}])
async def test_the_shell_reads_every_call_otherwise(fields: dict[str, Any]) -> None:
    events, upstream_side, upstream = await serve(fields)
    assert upstream_side.pulled == len(upstream_side.pieces)
    done = [e for e in events if isinstance(e, ToolCallDone)]
    assert [d.name for d in done] == ["get_weather", "get_time"]
    assert events[-1] == ResponseDone("tool_calls")
    assert upstream.tool_call_early_stops == 0


# --- the flags, and a parser that ends the answer in the closing chunk ------------------------


def test_object_end_flags_are_booleans_at_every_stage() -> None:
    scanner = ObjectEnd()
    assert (scanner.closed, scanner.gave_up) == (False, False)
    assert not scanner.feed('{"a": "')
    assert (scanner.closed, scanner.gave_up) == (False, False)
    assert scanner.feed('"}')
    assert (scanner.closed, scanner.gave_up) == (True, False)
    other = ObjectEnd()
    assert not other.feed("[]")
    assert (other.closed, other.gave_up) == (False, True)


@pytest.mark.parametrize(
    "before",
    ["\u00a0", "\x0b", "\x0c", "\u2028", "\u3000"],
    ids=["no-break-space", "vertical-tab", "form-feed", "line-separator", "ideographic-space"],
)
def test_only_json_whitespace_may_come_before_the_object(before: str) -> None:
    # Python calls these whitespace; JSON does not, and json.loads would refuse the arguments.
    scanner = ObjectEnd()
    assert not scanner.feed(before + "{}")
    assert scanner.gave_up


def test_a_parser_that_ends_the_answer_in_the_closing_chunk_is_not_cut() -> None:
    # Gemini sends a call whole, with the finish and the usage, in one chunk: its parser gives the
    # fragment, the call, the usage and the end at once, after the closing fragment. Nothing is
    # left to cut, so nothing is: not stopped, no early stop counted, the connection reusable.
    chunks = [
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "let me look"}]}}]},
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}],
                    },
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4},
        },
    ]
    events = [SSEEvent(data=json.dumps(chunk).encode()) for chunk in chunks]
    parser = FirstToolCallOnly(GeminiDialect().new_parser("gemini"))
    assert parser.stopped is False
    out, read = run(parser, events)
    assert read == 2 and parser.done
    assert parser.stopped is False
    [delta] = [e for e in out if isinstance(e, ToolCallDelta)]
    assert delta.id is not None
    assert out[-3:] == [
        ToolCallDone(0, delta.id, "f", {"a": 1}, '{"a": 1}', True),
        Usage(3, 4),
        ResponseDone("tool_calls"),
    ]
