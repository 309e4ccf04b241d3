"""The gemini dialect's stream parser: streamGenerateContent's SSE chunks to the gateway's
events, split anywhere; finish reasons, usage, blocked prompts, errors mid-stream, malformed
chunks; and ``parse_whole``, which reads the same chunks unstreamed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.genai import types as genai_types
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.core.errors import (
    GatewayError,
    InvalidRequest,
    UnusableAnswer,
    UpstreamOverloaded,
    UpstreamProtocolError,
    UpstreamRateLimited,
)
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
from trio_gateway.core.reasoning_details import GOOGLE
from trio_gateway.core.sse import SSEDecoder, SSEEvent
from trio_gateway.core.usage import PartialUsage
from trio_gateway.providers.gemini.dialect import (
    FAILED_FINISH_REASONS,
    FINISH_REASONS,
    GeminiStreamParser,
    parse_whole,
)


def frame(value: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(value).encode() + b"\r\n\r\n"


def chunk(
    *parts: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-2.5-flash"}
    if usage is not None:
        out["usageMetadata"] = usage
    return out


def run(raw: bytes, splits: list[int] | None = None) -> list[Event]:
    decoder = SSEDecoder()
    parser = GeminiStreamParser("gem")
    pieces = []
    start = 0
    for cut in sorted(splits or []):
        pieces.append(raw[start:cut])
        start = cut
    pieces.append(raw[start:])
    events: list[Event] = []
    for piece in pieces:
        for sse in decoder.feed(piece):
            events += parser.feed(sse)
            if parser.done:
                return events
    for sse in decoder.close():
        events += parser.feed(sse)
    return events + parser.close()


THINKING_STREAM = b"".join(
    [
        frame(chunk({"text": "Let me think", "thought": True}, usage={"promptTokenCount": 12})),
        frame(
            chunk({"text": " about it.", "thought": True}, {"text": "", "thoughtSignature": "c2ln"})
        ),
        frame(
            chunk({"text": "Bonjour "}, usage={"promptTokenCount": 12, "candidatesTokenCount": 1})
        ),
        frame(
            chunk(
                {"text": "le monde"},
                finish="STOP",
                usage={
                    "promptTokenCount": 12,
                    "cachedContentTokenCount": 8,
                    "candidatesTokenCount": 4,
                    "thoughtsTokenCount": 30,
                    "totalTokenCount": 46,
                },
            )
        ),
    ]
)
THINKING_EVENTS: list[Event] = [
    ResponseStarted("gem"),
    ReasoningDelta("Let me think"),
    ReasoningDelta(" about it."),
    # A signature on a part that calls nothing: handed on without an id.
    ReasoningDetail(0, GOOGLE, data="c2ln"),
    TextDelta("Bonjour "),
    TextDelta("le monde"),
    Usage(prompt_tokens=12, completion_tokens=34, reasoning_tokens=30, cached_tokens=8),
    ResponseDone("stop"),
]


def test_thought_parts_are_reasoning_and_usage_is_the_last() -> None:
    assert run(THINKING_STREAM) == THINKING_EVENTS


@settings(max_examples=200, deadline=None)
@given(splits=st.lists(st.integers(0, len(THINKING_STREAM)), max_size=12))
def test_any_byte_split_gives_the_same_events(splits: list[int]) -> None:
    assert run(THINKING_STREAM, splits) == THINKING_EVENTS


def test_done_when_finish_and_usage_arrive() -> None:
    parser = GeminiStreamParser("gem")
    parser.feed(SSEEvent(json.dumps(chunk({"text": "a"})).encode()))
    assert not parser.done
    events = parser.feed(
        SSEEvent(json.dumps(chunk(finish="STOP", usage={"promptTokenCount": 1})).encode())
    )
    assert parser.done
    assert events[-1] == ResponseDone("stop")
    assert parser.close() == []
    with pytest.raises(UpstreamProtocolError):
        parser.feed(SSEEvent(b'{"candidates": []}'))


def test_two_function_calls_get_unique_ids_and_finish_tool_calls() -> None:
    raw = frame(
        chunk(
            {
                "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                "thoughtSignature": "c2ln",
            },
            {"functionCall": {"name": "now"}},
            finish="STOP",
            usage={"promptTokenCount": 5, "candidatesTokenCount": 9},
        )
    )
    events = run(raw)
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    done = [e for e in events if isinstance(e, ToolCallDone)]
    assert [(d.index, d.name, d.arguments) for d in deltas] == [
        (0, "get_weather", '{"city": "Paris"}'),
        (1, "now", "{}"),
    ]
    assert all(d.id and d.id.startswith("call_") for d in deltas)
    assert len({d.id for d in deltas}) == 2
    assert [(d.id, d.name, d.arguments, d.arguments_valid) for d in done] == [
        (deltas[0].id, "get_weather", {"city": "Paris"}, True),
        (deltas[1].id, "now", {}, True),
    ]
    assert events[-2:] == [Usage(5, 9), ResponseDone("tool_calls")]
    # Fresh ids for every answer.
    again = [e for e in run(raw) if isinstance(e, ToolCallDelta)]
    assert {d.id for d in again}.isdisjoint({d.id for d in deltas})


# Every value of Google's FinishReason enum (google-genai's types.FinishReason, which follows
# https://ai.google.dev/api/generate-content#FinishReason and Vertex AI's), and what it becomes.
ANSWERS = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "CONTINUATION": "length",
    **dict.fromkeys(
        [
            "SAFETY",
            "RECITATION",
            "LANGUAGE",
            "BLOCKLIST",
            "PROHIBITED_CONTENT",
            "SPII",
            "IMAGE_SAFETY",
            "IMAGE_PROHIBITED_CONTENT",
            "IMAGE_RECITATION",
            "MODEL_ARMOR",
            "ESCALATION",
        ],
        "content_filter",
    ),
}
FAILURES = [
    "FINISH_REASON_UNSPECIFIED",
    "OTHER",
    "MALFORMED_FUNCTION_CALL",
    "UNEXPECTED_TOOL_CALL",
    "TOO_MANY_TOOL_CALLS",
    "MISSING_THOUGHT_SIGNATURE",
    "MALFORMED_RESPONSE",
    "IMAGE_OTHER",
    "NO_IMAGE",
    "PUP_LIMITED_DISABLED",
]


def test_every_finish_reason_google_documents_is_decided() -> None:
    documented = {reason.value for reason in genai_types.FinishReason}
    assert set(ANSWERS) | set(FAILURES) == documented
    assert dict(FINISH_REASONS) == ANSWERS
    assert set(FAILED_FINISH_REASONS) == set(FAILURES)


@pytest.mark.parametrize(("reason", "finish"), sorted(ANSWERS.items()))
def test_finish_reasons_that_end_an_answer(reason: str, finish: str) -> None:
    events = run(frame(chunk({"text": "x"}, finish=reason, usage={"promptTokenCount": 1})))
    assert events[-1] == ResponseDone(finish)


@pytest.mark.parametrize("reason", [*FAILURES, "SOMETHING_NEW"])
def test_finish_reasons_that_are_no_answer_are_an_upstream_error(reason: str) -> None:
    """An empty answer ending in MALFORMED_FUNCTION_CALL once looked like success (stop)."""
    parser = GeminiStreamParser("gem")
    parser.feed(SSEEvent(json.dumps(chunk({"text": "a"}, usage={"promptTokenCount": 3})).encode()))
    last = chunk(finish=reason, usage={"promptTokenCount": 3, "candidatesTokenCount": 4})
    last["candidates"][0]["finishMessage"] = "Malformed function call: print(default_api.f("
    with pytest.raises(UnusableAnswer) as caught:
        parser.feed(SSEEvent(json.dumps(last).encode()))
    error = caught.value
    assert (error.code, error.status, error.provider) == ("upstream_error", 502, "gem")
    assert error.message.startswith(f"gem: the answer ended with finishReason {reason} (")
    assert error.message.endswith("): Malformed function call: print(default_api.f(")
    # What was generated is billed: the last count, which covered the failing chunk.
    assert parser.usage_so_far() == PartialUsage(Usage(3, 4), estimated=False)
    # The whole answer (generateContent) fails the same way.
    with pytest.raises(UnusableAnswer):
        parse_whole("gem", json.dumps(last).encode())


def test_usage_after_the_finishing_chunk_is_waited_for() -> None:
    raw = frame(chunk({"text": "x"}, finish="MAX_TOKENS")) + frame(
        {"usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 7}}
    )
    assert run(raw) == [
        ResponseStarted("gem"),
        TextDelta("x"),
        Usage(3, 7),
        ResponseDone("length"),
    ]


def test_a_finish_without_usage_ends_at_the_close() -> None:
    parser = GeminiStreamParser("gem")
    parser.feed(SSEEvent(json.dumps(chunk({"text": "x"}, usage={"promptTokenCount": 2})).encode()))
    parser.feed(SSEEvent(json.dumps(chunk(finish="STOP")).encode()))
    assert not parser.done
    assert parser.close() == [Usage(2, 0), ResponseDone("stop")]


def test_a_truncated_stream_is_a_protocol_error() -> None:
    raw = frame(chunk({"text": "half"}, usage={"promptTokenCount": 2}))
    with pytest.raises(UpstreamProtocolError, match="before the answer finished"):
        run(raw)
    # Cut inside a frame: the decoder hands over a half JSON object.
    with pytest.raises(UpstreamProtocolError):
        run(THINKING_STREAM[:-20])


def test_an_error_mid_stream_is_raised_from_feed() -> None:
    error = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    raw = frame(chunk({"text": "a"})) + frame(error)
    with pytest.raises(UpstreamOverloaded, match="overloaded"):
        run(raw)
    quota = {"error": {"message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}}
    with pytest.raises(UpstreamRateLimited):
        run(frame(quota))


def test_a_blocked_prompt_is_a_content_filter_answer() -> None:
    raw = frame(
        {
            "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
            "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
        }
    )
    parser = GeminiStreamParser("gem")
    events = parser.feed(SSEDecoder().feed(raw)[0])
    assert parser.done
    assert events == [ResponseStarted("gem"), Usage(9, 0), ResponseDone("content_filter")]


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1]",
        b'{"candidates": {}}',
        b'{"candidates": [{"content": {"parts": [{"text": 5}]}}]}',
        b'{"candidates": [{"content": {"parts": [{"functionCall": {"args": {}}}]}}]}',
        b'{"candidates": [{"finishReason": 3}]}',
    ],
)
def test_malformed_chunks(payload: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        GeminiStreamParser("gem").feed(SSEEvent(payload))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
PARTS = st.fixed_dictionaries(
    {},
    optional={
        "text": JSON,
        "thought": JSON,
        "functionCall": st.fixed_dictionaries({}, optional={"name": JSON, "args": JSON}),
    },
)
CHUNKS = st.fixed_dictionaries(
    {},
    optional={
        "candidates": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "content": st.fixed_dictionaries(
                        {}, optional={"parts": st.lists(PARTS, max_size=3)}
                    ),
                    "finishReason": st.sampled_from(["STOP", "MAX_TOKENS", "SAFETY"]) | JSON,
                },
            ),
            max_size=2,
        ),
        "usageMetadata": st.dictionaries(
            st.sampled_from(["promptTokenCount", "candidatesTokenCount", "thoughtsTokenCount"]),
            JSON,
        ),
        "promptFeedback": JSON,
        "error": JSON,
    },
)


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(CHUNKS, max_size=4))
def test_any_chunks_give_events_or_a_gateway_error(chunks: list[dict[str, Any]]) -> None:
    parser = GeminiStreamParser("gem")
    try:
        for value in chunks:
            if parser.done:
                break
            parser.feed(SSEEvent(json.dumps(value).encode()))
        parser.close()
    except GatewayError:
        pass


def test_parse_whole() -> None:
    body = chunk(
        {"text": "hm", "thought": True},
        {"text": "yes"},
        {"functionCall": {"name": "f", "args": {"a": [1]}}},
        finish="STOP",
        usage={"promptTokenCount": 4, "candidatesTokenCount": 2, "thoughtsTokenCount": 1},
    )
    events = parse_whole("gem", json.dumps(body).encode())
    assert [type(e).__name__ for e in events] == [
        "ResponseStarted",
        "ReasoningDelta",
        "TextDelta",
        "ToolCallDelta",
        "ToolCallDone",
        "Usage",
        "ResponseDone",
    ]
    assert events[-2:] == [Usage(4, 3, reasoning_tokens=1), ResponseDone("tool_calls")]
    # streamGenerateContent without alt=sse: a JSON array of the chunks.
    array = [
        chunk({"text": "a"}),
        chunk({"text": "b"}, finish="STOP", usage={"promptTokenCount": 1}),
    ]
    texts = [
        e.text for e in parse_whole("gem", json.dumps(array).encode()) if isinstance(e, TextDelta)
    ]
    assert texts == ["a", "b"]
    with pytest.raises(UpstreamProtocolError):
        parse_whole("gem", b"<html>")
    with pytest.raises(InvalidRequest):
        parse_whole(
            "gem", b'{"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}'
        )
