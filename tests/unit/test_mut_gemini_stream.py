"""Gemini's stream parser, whole answers and dialect calls (``providers/gemini.py``): each
malformed-stream message, the tool-call bounds, ``usage_so_far`` and the URLs.

Written for mutation testing (docs/testing.md): the dialect tests reach these with one typical
value; these pin what a client or operator sees.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import UpstreamProtocolError, UpstreamServerError
from trio_gateway.core.events import (
    Event,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from trio_gateway.core.request import validate_chat_body
from trio_gateway.core.sse import SSEEvent
from trio_gateway.core.usage import PartialUsage
from trio_gateway.providers.gemini.dialect import (
    MAX_TOOL_CALLS,
    GeminiDialect,
    GeminiStreamParser,
    VertexDialect,
    parse_usage,
    parse_whole,
)


def frame(payload: object) -> SSEEvent:
    return SSEEvent(data=json.dumps(payload).encode())


def parts(*items: dict[str, Any], **candidate: Any) -> dict[str, Any]:
    return {"candidates": [{"content": {"parts": list(items)}, **candidate}]}


def call(name: str, args: object = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if args is not None:
        function["args"] = args
    return {"functionCall": function}


def malformed(parser: GeminiStreamParser, payload: object) -> UpstreamProtocolError:
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.feed(frame(payload))
    assert caught.value.provider == "gem"
    return caught.value


# --- malformed streams -------------------------------------------------------------------------

MALFORMED = "gem sent a malformed stream: "


def test_a_chunk_that_is_not_json() -> None:
    parser = GeminiStreamParser("gem")
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.feed(SSEEvent(data=b"{"))
    assert caught.value.message.startswith(MALFORMED + "a chunk that is not JSON (")
    assert caught.value.provider == "gem"


@pytest.mark.parametrize(
    ("function_call", "what"),
    [
        ("f", "a functionCall that is not an object"),
        ({"name": ""}, "a functionCall without a name"),
        ({"name": 3}, "a functionCall without a name"),
        ({}, "a functionCall without a name"),
    ],
)
def test_bad_function_calls(function_call: object, what: str) -> None:
    error = malformed(GeminiStreamParser("gem"), parts({"functionCall": function_call}))
    assert error.message == MALFORMED + what


@pytest.mark.parametrize(
    ("payload", "what"),
    [
        ([1], "a chunk that is not an object"),
        ({"candidates": ["x"]}, "a candidate that is not an object"),
        ({"candidates": [{"content": "x"}]}, "a candidate's 'content' is not an object"),
        ({"candidates": [{"content": {"parts": "x"}}]}, "'parts' is not a list"),
        ({"candidates": [{"content": {"parts": ["x"]}}]}, "a part that is not an object"),
        (parts({"text": 3}), "a part's text is not a string"),
        (parts(finishReason=3), "'finishReason' is not a string"),
        ({"candidates": {}}, "'candidates' is not a list"),
    ],
)
def test_malformed_chunks(payload: object, what: str) -> None:
    assert malformed(GeminiStreamParser("gem"), payload).message == MALFORMED + what


def test_an_error_frame_names_the_provider() -> None:
    with pytest.raises(UpstreamServerError) as caught:
        GeminiStreamParser("gem").feed(frame({"error": {"code": 500, "message": "m"}}))
    assert caught.value.provider == "gem"


def test_data_after_the_finish() -> None:
    parser = GeminiStreamParser("gem")
    parser.feed(frame({**parts(finishReason="STOP"), "usageMetadata": {}}))
    assert parser.done
    error = malformed(parser, parts({"text": "late"}))
    assert error.message == MALFORMED + "data after the answer finished"


def test_at_most_max_tool_calls() -> None:
    parser = GeminiStreamParser("gem")
    events = parser.feed(frame(parts(*[call(f"f{i}") for i in range(MAX_TOOL_CALLS)])))
    assert [e.index for e in events if isinstance(e, ToolCallDelta)] == list(range(MAX_TOOL_CALLS))
    error = malformed(parser, parts(call("one_more")))
    assert error.message == MALFORMED + f"more than {MAX_TOOL_CALLS} function calls"


def test_arguments_over_the_assembler_bound() -> None:
    error = malformed(GeminiStreamParser("gem"), parts(call("f", {"a": "x" * (1 << 20)})))
    assert error.message == MALFORMED + "tool call 0 arguments exceed 1048576 bytes"


def test_close_before_the_finish_names_the_provider() -> None:
    parser = GeminiStreamParser("gem")
    parser.feed(frame(parts({"text": "hi"})))
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.close()
    assert caught.value.message == "gem closed the stream before the answer finished"
    assert caught.value.provider == "gem"


# --- tool calls and usage ----------------------------------------------------------------------


def test_tool_calls_keep_non_ascii_arguments_and_count_up() -> None:
    events = GeminiStreamParser("gem").feed(
        frame(parts(call("a", {"city": "Zürich"}), call("b"), call("c", {})))
    )
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [(c.index, c.name, c.arguments) for c in calls] == [
        (0, "a", '{"city": "Zürich"}'),
        (1, "b", "{}"),
        (2, "c", "{}"),
    ]


def test_usage_so_far_counts_text_and_arguments_after_the_last_count() -> None:
    parser = GeminiStreamParser("gem")
    assert parser.usage_so_far() is None
    parser.feed(frame(parts({"text": "abcd"}, call("f", {"k": "vv"}))))  # 4 + 11 characters
    assert parser.usage_so_far() == PartialUsage(Usage(0, 4), estimated=True)


def test_usage_so_far_counts_every_part() -> None:
    parser = GeminiStreamParser("gem")
    parser.feed(frame(parts({"text": "abcdefgh"}, {"text": "ijkl"})))
    assert parser.usage_so_far() == PartialUsage(Usage(0, 3), estimated=True)


@pytest.mark.parametrize(
    ("metadata", "usage"),
    [
        ({}, Usage(0, 0, None, None)),
        (
            {
                "promptTokenCount": 0,
                "candidatesTokenCount": 0,
                "thoughtsTokenCount": 0,
                "cachedContentTokenCount": 0,
            },
            Usage(0, 0, 0, 0),
        ),
        ({"promptTokenCount": -1, "thoughtsTokenCount": True}, Usage(0, 0, None, None)),
    ],
)
def test_parse_usage(metadata: dict[str, Any], usage: Usage) -> None:
    assert parse_usage(metadata) == usage


def test_usage_so_far_adds_to_the_last_count_and_keeps_its_details() -> None:
    parser = GeminiStreamParser("gem")
    metadata = {
        "promptTokenCount": 10,
        "candidatesTokenCount": 5,
        "thoughtsTokenCount": 3,
        "cachedContentTokenCount": 2,
    }
    parser.feed(frame({**parts({"text": "x"}), "usageMetadata": metadata}))
    assert parser.usage_so_far() == PartialUsage(Usage(10, 8, 3, 2), estimated=False)
    parser.feed(frame(parts({"text": "abcdefgh"})))
    assert parser.usage_so_far() == PartialUsage(Usage(10, 10, 3, 2), estimated=True)


# --- whole answers -----------------------------------------------------------------------------

DONE = {**parts({"text": "hi"}, finishReason="STOP"), "usageMetadata": {"promptTokenCount": 1}}
WHOLE: list[Event] = [
    ResponseStarted(provider="gem"),
    TextDelta(text="hi"),
    Usage(1, 0),
    ResponseDone(finish_reason="stop"),
]


@pytest.mark.parametrize(
    "body",
    [json.dumps(DONE).encode(), json.dumps([DONE, parts({"text": "after"})]).encode()],
)
def test_parse_whole(body: bytes) -> None:
    assert parse_whole("gem", body) == WHOLE
    assert GeminiDialect().parse_whole("gem", body) == WHOLE


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "gem sent an answer that is not JSON ("),
        (b"[1]", "gem sent an answer that is not an object"),
        (b"3", "gem sent an answer that is not an object"),
    ],
)
def test_parse_whole_errors(body: bytes, message: str) -> None:
    with pytest.raises(UpstreamProtocolError) as caught:
        parse_whole("gem", body)
    assert caught.value.message.startswith(message)
    assert caught.value.provider == "gem"


# --- the dialects ------------------------------------------------------------------------------

GEMINI = ProviderConfig(
    name="gem", type="gemini", model="models/tuned/x", api_key_env="K", base_url="https://g"
)


def test_gemini_call() -> None:
    request = validate_chat_body({"model": "a", "messages": [{"role": "user", "content": "é"}]})
    made = GeminiDialect().build_call(request, GEMINI)
    assert made.url == "https://g/v1beta/models/tuned%2Fx:streamGenerateContent?alt=sse"
    assert '"text": "é"'.encode() in made.body
    assert dict(made.headers) == {"content-type": "application/json", "accept": "text/event-stream"}
    parser = GeminiDialect().new_parser("gem")
    assert parser.feed(frame(parts({"text": "a"}))) == [ResponseStarted("gem"), TextDelta("a")]


def test_vertex_url() -> None:
    vertex = ProviderConfig(
        name="vtx",
        type="vertex",
        model="models/gemini-x",
        credentials_file="/sa.json",
        project="p/1",
        location="eu",
        base_url="https://v",
    )
    assert VertexDialect().url(vertex) == (
        "https://v/v1/projects/p%2F1/locations/eu/publishers/google/models/gemini-x"
        ":streamGenerateContent?alt=sse"
    )


@pytest.mark.parametrize(("project", "location"), [("p", None), (None, "eu"), (None, None)])
def test_vertex_needs_a_project_and_a_location(project: str | None, location: str | None) -> None:
    vertex = ProviderConfig(
        name="vtx",
        type="vertex",
        model="m",
        credentials_file="/sa.json",
        project=project,
        location=location,
    )
    with pytest.raises(UpstreamServerError) as caught:
        VertexDialect().url(vertex)
    assert caught.value.message == "vtx: a vertex provider needs a project and a location"
    assert caught.value.provider == "vtx"
