"""Gemini's thought signatures both ways: the parser hands each on as a reasoning detail (``id``:
the call it was sent on), and an assistant message's details put each back on its part,
untouched; a history without them gets Google's placeholder, as before."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.gemini_helpers import check_with_sdk
from trio_gateway.core.events import ReasoningDetail, ToolCallDelta
from trio_gateway.core.reasoning_details import ANTHROPIC, GOOGLE
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.gemini.dialect import GeminiStreamParser
from trio_gateway.providers.gemini.request import SKIP_SIGNATURE, translate_messages

# --- the answer --------------------------------------------------------------------------------


def test_each_signed_call_hands_on_its_signature_with_the_calls_id() -> None:
    parser = GeminiStreamParser("gem")
    call = {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}
    chunk = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "plan", "thought": True},
                        call | {"thoughtSignature": "c2lnLTE="},
                        # Parallel calls: Gemini signs the first only.
                        call,
                        {"text": "", "thoughtSignature": "dGV4dA=="},
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {"promptTokenCount": 3},
    }
    events = parser.handle(chunk)
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    details = [e for e in events if isinstance(e, ReasoningDetail)]
    assert details == [
        ReasoningDetail(0, GOOGLE, data="c2lnLTE=", tool_call_id=calls[0].id),
        ReasoningDetail(1, GOOGLE, data="dGV4dA=="),
    ]
    # Each right after the part it came on.
    assert events.index(details[0]) == events.index(calls[0]) + 1


def test_a_signature_that_is_not_a_string_is_a_broken_stream() -> None:
    from trio_gateway.core.errors import UpstreamProtocolError

    parser = GeminiStreamParser("gem")
    part = {"text": "x", "thoughtSignature": 5}
    with pytest.raises(UpstreamProtocolError):
        parser.handle({"candidates": [{"content": {"parts": [part]}}]})


# --- the request -------------------------------------------------------------------------------


def call(call_id: str, city: str) -> dict[str, Any]:
    arguments = json.dumps({"city": city})
    return {"id": call_id, "type": "function", "function": {"name": "w", "arguments": arguments}}


def detail(data: str, call_id: str | None = None, format: str | None = GOOGLE) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "reasoning.encrypted", "data": data, "format": format}
    return out if call_id is None else out | {"id": call_id}


def model_parts(details: Any, content: str | None = "looking") -> list[dict[str, Any]]:
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "tool_calls": [call("call_a", "Paris"), call("call_b", "Lyon")],
    }
    if details is not None:
        assistant["reasoning_details"] = details
    messages = [
        {"role": "user", "content": "weather?"},
        assistant,
        {"role": "tool", "tool_call_id": "call_a", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "17C"},
    ]
    request = validate_chat_body({"model": "a", "messages": messages})
    _, contents = translate_messages(request.body["messages"])
    check_with_sdk({"contents": contents})
    parts: list[dict[str, Any]] = contents[1]["parts"]
    return parts


SKIP = SKIP_SIGNATURE
# Signatures are base64 (the SDK checks).
A, B, T, Z = "c2lnLWE=", "c2lnLWI=", "c2lnLXQ=", "c2lnLXo="
CASES: list[tuple[str, Any, list[str | None]]] = [
    # (what, reasoning_details, the thoughtSignature of: the text part, call_a's, call_b's)
    ("as before: no details", None, [None, SKIP, SKIP]),
    ("as before: empty details", [], [None, SKIP, SKIP]),
    ("the first call signed", [detail(A, "call_a")], [None, A, None]),
    ("both", [detail(B, "call_b"), detail(A, "call_a")], [None, A, B]),
    ("and the text", [detail(A, "call_a"), detail(T)], [T, A, None]),
    ("another vendor's only", [detail("x", "call_a", ANTHROPIC)], [None, SKIP, SKIP]),
    ("ids it does not know", [detail(Z, "call_z")], [None, SKIP, SKIP]),
]  # fmt: skip


@pytest.mark.parametrize(("what", "details", "signatures"), CASES)
def test_each_part_gets_back_its_signature(
    what: str, details: Any, signatures: list[str | None]
) -> None:
    parts = model_parts(details)
    assert [p.get("thoughtSignature") for p in parts] == signatures, what
    assert [next(iter(p)) for p in parts] == ["text", "functionCall", "functionCall"]


def test_a_text_signature_without_text_has_no_part_to_go_on() -> None:
    parts = model_parts([detail(T), detail(A, "call_a")], content=None)
    assert [p.get("thoughtSignature") for p in parts] == [A, None]
