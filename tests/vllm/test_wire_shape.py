"""The conformance test's normaliser (wire_shape.py), on small hand-written transcripts.

No server needed: these run in `make test`, so the helper that decides "same wire" is itself
checked to notice a renamed key, a changed type, a missing chunk or a different status.
"""

from __future__ import annotations

import json
from typing import Any

from tests.vllm.wire_shape import Transcript, differences, kinds_of, parse_sse, shape, signature

Json = dict[str, Any]


def chunk(delta: Json | None, finish: str | None = None, **extra: Any) -> Json:
    choice: Json = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "qwen3-32b",
        "choices": [choice],
        **extra,
    }


USAGE: Json = {
    "id": "chatcmpl-0123456789abcdef",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "qwen3-32b",
    "choices": [],
    "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2},
}


def sse(*events: Json | str) -> str:
    return "".join(
        f"data: {e if isinstance(e, str) else json.dumps(e, ensure_ascii=False)}\n\n"
        for e in events
    )


def stream(*events: Json | str) -> Transcript:
    return Transcript.from_http(200, "text/event-stream; charset=utf-8", sse(*events))


REFERENCE = stream(
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning": "a"}),
    chunk({"reasoning": "b"}),
    chunk({"content": "\n\n"}),
    chunk({"content": "hi"}, "stop"),
    USAGE,
    "[DONE]",
)


def test_parse_sse_keeps_order_and_done() -> None:
    events = parse_sse(sse({"a": 1}, "[DONE]") + "\n: comment\n\n")
    assert events == [{"a": 1}, "[DONE]"]


def test_kinds_collapse_repeats_and_split_a_visible_finish() -> None:
    assert kinds_of(REFERENCE.events or ()) == (
        *("role", "reasoning", "content", "finish", "usage", "done"),
    )
    tool = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": None, "tool_calls": [{"id": "chatcmpl-tool-x", "index": 0}]}),
        chunk({"content": None, "tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}),
        chunk({}, "tool_calls"),
        "[DONE]",
    ]
    assert kinds_of(tool) == ("role", "tool_first", "tool_args", "finish", "done")


def test_same_shape_with_other_text_and_more_deltas() -> None:
    other = stream(
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning": "thinking long"}),
        chunk({"content": "\n\n"}),
        chunk({"content": "x"}),
        chunk({"content": "yz"}, "stop"),
        {
            **USAGE,
            "id": "chatcmpl-fedcba9876543210",
            "usage": {**USAGE["usage"], "total_tokens": 9},
        },
        "[DONE]",
    )
    assert differences(signature(REFERENCE), signature(other)) == []


def test_a_renamed_delta_key_is_a_difference() -> None:
    renamed = stream(
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "a"}),
        chunk({"content": "hi"}, "stop"),
        USAGE,
        "[DONE]",
    )
    found = differences(signature(REFERENCE), signature(renamed))
    assert "reasoning: only reference: $.reasoning: str" in found
    assert "reasoning: only candidate: $.reasoning_content: str" in found


def test_a_missing_usage_chunk_changes_the_order() -> None:
    events = [e for e in (REFERENCE.events or ()) if e != USAGE]
    without = stream(*events)
    found = differences(signature(REFERENCE), signature(without))
    assert (
        "order: role reasoning content finish usage done != role reasoning content finish done"
        in (found)
    )


def test_types_values_status_and_media_type_count() -> None:
    vllm = Transcript.from_http(
        400,
        "application/json",
        '{"error":{"message":"m","type":"BadRequestError","param":"input_tokens","code":400}}',
    )
    openai_style = Transcript.from_http(
        400,
        "application/json",
        '{"error":{"message":"m","type":"BadRequestError","param":"input_tokens",'
        '"code":"context_length_exceeded"}}',
    )
    found = differences(signature(vllm), signature(openai_style))
    assert found == [
        "body: only reference: $.error.code: int",
        "body: only candidate: $.error.code: str",
    ]
    text = Transcript.from_http(404, "text/plain", "Not Found")
    found = differences(signature(vllm), signature(text))
    assert "status: 400 != 404" in found and "media type: application/json != text/plain" in found


def test_random_hex_in_ids_is_not_a_difference_but_the_id_form_is() -> None:
    assert shape({"id": "chatcmpl-tool-0123abcd4567ef89"}) == {
        "$: dict",
        "$.id: str = chatcmpl-tool-<hex>",
    }
    assert shape({"id": "call_0"}) != shape({"id": "chatcmpl-tool-0123abcd4567ef89"})
    assert shape({"n": 1}) != shape({"n": 1.0}) != shape({"n": True})
