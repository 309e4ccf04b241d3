"""``fronts/responses/events.py``: gateway events → the Responses stream and ``response``
object, judged by the openai SDK's own stream state machine and types (no server)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai import omit
from openai._models import construct_type_unchecked
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from trio_gateway.core.errors import UpstreamServerError
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
from trio_gateway.fronts.responses.events import ResponseWriter
from trio_gateway.fronts.responses.seal import Sealer

SEALER = Sealer()
STRICT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
ECHO: dict[str, Any] = {
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "metadata": {},
}


def writer(*, streaming: bool, summary: bool = False, **kwargs: Any) -> ResponseWriter:
    return ResponseWriter(
        response_id="resp_abc",
        created_at=1,
        model="agent-lite",
        echo=ECHO,
        summary=summary,
        tool_names=kwargs.get("tool_names", {}),
        seal=SEALER.seal,
        streaming=streaming,
        seal_always=kwargs.get("seal_always", False),
    )


def sse(data: bytes) -> list[dict[str, Any]]:
    """The events of a stream, each checked: its ``event:`` line names its type."""
    events = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        name, payload = block.split("\n")
        event = json.loads(payload.removeprefix("data: "))
        assert name == "event: " + event["type"]
        events.append(event)
    return events


def run(events: Sequence[Event], **kwargs: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    stream = writer(streaming=True, **kwargs)
    out = b"".join(stream.encode(e) for e in events)
    whole = writer(streaming=False, **kwargs)
    for e in events:
        whole.add(e)
    assert whole.encode(ResponseStarted(provider="p")) == b""
    return sse(out), whole.result()


def judge(events: list[dict[str, Any]]) -> Any:
    """Every event through the SDK's stream state; the response it ends with."""
    state: Any = ResponseStreamState(input_tools=omit, text_format=omit)
    for raw in events:
        # Strictly: every field the SDK's type requires, of its type.
        STRICT.validate_python(raw)
        event_type: Any = ResponseStreamEvent
        state.handle_event(construct_type_unchecked(type_=event_type, value=raw))
    return state._completed_response


TEXT: list[Event] = [
    ResponseStarted(provider="p"),
    TextDelta("Hel"),
    TextDelta("lo"),
    Usage(5, 2),
    ResponseDone("stop"),
]


def test_text_stream_and_whole_agree() -> None:
    events, whole = run(TEXT)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = judge(events)
    assert final.output_text == "Hello"
    assert events[-1]["response"] == whole
    parsed = Response.model_validate(whole)
    assert parsed.output_text == "Hello" and parsed.status == "completed"
    assert parsed.usage is not None and parsed.usage.total_tokens == 7


def test_parallel_calls_done_at_the_end_stay_open_until_then() -> None:
    calls: list[Event] = [
        ResponseStarted(provider="p"),
        ToolCallDelta(0, "c0", "f", '{"a":'),
        ToolCallDelta(1, "c1", "ns__g", "{}"),
        ToolCallDelta(0, None, None, "1}"),
        ToolCallDone(0, "c0", "f", {"a": 1}, '{"a":1}', True),
        ToolCallDone(1, "c1", "ns__g", {}, "{}", True),
        ResponseDone("tool_calls"),
    ]
    events, whole = run(calls, tool_names={"ns__g": ("ns", "g")})
    final = judge(events)
    assert [(o.call_id, o.name, o.arguments) for o in final.output] == [
        ("c0", "f", '{"a":1}'),
        ("c1", "g", "{}"),
    ]
    assert whole["output"][1]["namespace"] == "ns"
    assert all(item["status"] == "completed" for item in whole["output"])


def test_reasoning_as_text_or_summary_and_thinking_sealed() -> None:
    detail = ReasoningDetail(index=0, format="anthropic-claude-v1", text="hmm", signature="sig")
    answer: list[Event] = [
        ReasoningDelta("hm"),
        ReasoningDelta("m"),
        detail,
        TextDelta("\n\n"),
        TextDelta("ok"),
        ResponseDone("stop"),
    ]
    events, whole = run(answer)
    reasoning = whole["output"][0]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "hmm"}]
    assert SEALER.open(reasoning["encrypted_content"]) == [
        {
            "type": "reasoning.text",
            "text": "hmm",
            "signature": "sig",
            "format": "anthropic-claude-v1",
            "index": 0,
        }
    ]
    # The separator after thinking is not the answer's.
    assert judge(events).output_text == "ok"
    assert "response.reasoning_text.delta" in {e["type"] for e in events}
    events, whole = run(answer, summary=True)
    assert whole["output"][0]["summary"] == [{"type": "summary_text", "text": "hmm"}]
    types = [e["type"] for e in events]
    assert (
        types.index("response.reasoning_summary_part.added")
        < types.index("response.reasoning_summary_text.delta")
        < types.index("response.reasoning_summary_text.done")
        < types.index("response.reasoning_summary_part.done")
    )
    judge(events)


def test_a_signature_after_its_call_goes_into_a_last_reasoning_item() -> None:
    answer: list[Event] = [
        ReasoningDelta("think"),
        ToolCallDelta(0, "c0", "f", "{}"),
        ReasoningDetail(index=0, format="google-gemini-v1", data="SIG", tool_call_id="c0"),
        ToolCallDone(0, "c0", "f", {}, "{}", True),
        ResponseDone("tool_calls"),
    ]
    events, whole = run(answer)
    assert [item["type"] for item in whole["output"]] == ["reasoning", "function_call", "reasoning"]
    assert "encrypted_content" not in whole["output"][0]
    (detail,) = SEALER.open(whole["output"][2]["encrypted_content"]) or []
    assert detail["data"] == "SIG" and detail["id"] == "c0"
    judge(events)


def test_whitespace_alone_is_no_message() -> None:
    events, whole = run(
        [
            TextDelta("\n\n"),
            ToolCallDelta(0, "c", "f", "{}"),
            ToolCallDone(0, "c", "f", {}, "{}", True),
            ResponseDone("tool_calls"),
        ]
    )
    assert [item["type"] for item in whole["output"]] == ["function_call"]
    judge(events)


def test_a_cut_answer_is_incomplete_and_its_open_call_too() -> None:
    events, whole = run([ToolCallDelta(0, "c", "f", '{"a'), ResponseDone("length")])
    assert whole["status"] == "incomplete"
    assert whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert whole["output"][0]["status"] == "incomplete"
    assert events[-1]["type"] == "response.incomplete"
    judge(events)


def test_a_call_whose_arguments_were_cut_is_incomplete_when_done() -> None:
    """The tool-call assembler closes every call at the end, a cut one with arguments that do
    not parse: its item is incomplete, not completed."""
    cut = ToolCallDone(0, "c", "f", '{"a', '{"a', arguments_valid=False)
    events, whole = run([ToolCallDelta(0, "c", "f", '{"a'), cut, ResponseDone("length")])
    assert whole["status"] == "incomplete"
    assert whole["output"][0]["status"] == "incomplete"
    assert whole["output"][0]["arguments"] == '{"a'
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[0]["status"] == "incomplete"
    judge(events)


def test_an_error_mid_stream_is_response_failed() -> None:
    stream = writer(streaming=True)
    out = stream.encode(TextDelta("a")) + stream.fail(UpstreamServerError("boom"))
    events = sse(out)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {
        "code": "server_error",
        "message": "boom (upstream_error)",
    }
    assert events[-1]["response"]["status"] == "failed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    judge(events)  # the SDK accepts a failed stream (it has no completed response)


@given(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=20))
def test_any_text_in_any_pieces_comes_out_whole(pieces: list[str]) -> None:
    events, whole = run([TextDelta(p) for p in pieces] + [ResponseDone("stop")])
    text = "".join(pieces)
    if text.strip():
        assert judge(events).output_text == text
        assert Response.model_validate(whole).output_text == text
    else:
        assert whole["output"] == []


@pytest.mark.parametrize("finish", ["stop", "tool_calls"])
def test_completed_for_a_natural_end(finish: str) -> None:
    _, whole = run([TextDelta("x"), ResponseDone(finish)])
    assert whole["status"] == "completed" and whole["incomplete_details"] is None


THINKING: list[Event] = [
    ResponseStarted(provider="p"),
    ReasoningDelta("let me see"),
    TextDelta("yes"),
    Usage(5, 4),
    ResponseDone("stop"),
]


@pytest.mark.parametrize("seal_always", [False, True])
def test_reasoning_without_a_signature_is_sealed_only_when_the_client_asks(
    seal_always: bool,
) -> None:
    """include: ["reasoning.encrypted_content"] (the AI SDK with store: false): every reasoning
    item carries encrypted_content, as OpenAI's do, though a vLLM model signs nothing."""
    events, whole = run(THINKING, seal_always=seal_always)
    final = judge(events)
    for output in (whole["output"], [item.model_dump() for item in final.output]):
        reasoning = next(item for item in output if item["type"] == "reasoning")
        if seal_always:
            assert SEALER.open(reasoning["encrypted_content"]) == []
        else:
            assert reasoning.get("encrypted_content") is None
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert ("encrypted_content" in done[0]) is seal_always
