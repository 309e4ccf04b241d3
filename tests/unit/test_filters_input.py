"""Input filters (core/filters.input_match over core/request_texts.py; issue 40, item 6): every
text a model reads is matched, normalized, and what no model reads is not."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from trio_gateway.core.filter_match import FilterSpec, Matcher
from trio_gateway.core.filters import input_match

WORD = "leak-this"
MATCHER = Matcher([FilterSpec(name="inbound", patterns=(WORD,))])


def b64(text: str, mime: str = "text/plain") -> str:
    return f"data:{mime};base64," + base64.b64encode(text.encode()).decode()


def user(content: Any, **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **fields}


def tool(**function: Any) -> dict[str, Any]:
    return user("hi", tools=[{"type": "function", "function": {"name": "f", **function}}])


READ: dict[str, dict[str, Any]] = {
    "content": user(WORD),
    "text part": user([{"type": "text", "text": WORD}]),
    "full width": user("\uff4c\uff45\uff41\uff4b-\uff54\uff48\uff49\uff53"),
    "zero-width inside": user("leak\u200b-th\u2060is"),
    "soft hyphen inside": user("le\u00adak-this"),
    "tool description": tool(description=WORD),
    "tool name": user("hi", tools=[{"type": "function", "function": {"name": WORD}}]),
    "tool parameter description": tool(
        parameters={"type": "object", "properties": {"a": {"description": WORD}}}
    ),
    "tool parameter name": tool(parameters={"type": "object", "properties": {WORD: {}}}),
    "tool parameter enum": tool(parameters={"type": "string", "enum": [WORD]}),
    "legacy function": user("hi", functions=[{"name": "f", "description": WORD}]),
    "response_format description": user(
        "hi",
        response_format={"type": "json_schema", "json_schema": {"name": "o", "description": WORD}},
    ),
    "response_format schema": user(
        "hi",
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "o", "schema": {"title": WORD}},
        },
    ),
    "reasoning_content": {
        "messages": [{"role": "assistant", "content": "ok", "reasoning_content": WORD}]
    },
    "reasoning_details text": {
        "messages": [
            {
                "role": "assistant",
                "content": "ok",
                "reasoning_details": [{"type": "reasoning.text", "text": WORD, "signature": "s"}],
            }
        ]
    },
    "tool call arguments": {
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": WORD}}
                ],
            }
        ]
    },
    "tool result": {"messages": [{"role": "tool", "tool_call_id": "c", "content": WORD}]},
    "message name": {"messages": [{"role": "user", "content": "hi", "name": WORD}]},
    "refusal": {"messages": [{"role": "assistant", "refusal": WORD}]},
    "text file": user([{"type": "file", "file": {"file_data": b64(f"a {WORD}\n")}}]),
    "markdown file": user([{"type": "file", "file": {"file_data": b64(WORD, "text/markdown")}}]),
    "file name": user([{"type": "file", "file": {"filename": WORD, "file_data": b64("x")}}]),
    "completion prompt": {"prompt": ["ok", WORD]},
    "completion suffix": {"prompt": "ok", "suffix": WORD},
    "embeddings input": {"input": WORD},
    "passed through to vLLM": user("hi", chat_template_kwargs={"system_hint": WORD}),
}

NOT_READ: dict[str, dict[str, Any]] = {
    "model": {"model": WORD, **user("hi")},
    "user id": user("hi", user=WORD),
    "metadata": user("hi", metadata={"k": WORD}),
    "stop sequence": user("hi", stop=[WORD]),
    "tool call id": {"messages": [{"role": "tool", "tool_call_id": WORD, "content": "ok"}]},
    "signature": {
        "messages": [
            {
                "role": "assistant",
                "content": "ok",
                "reasoning_details": [{"type": "reasoning.text", "text": "t", "signature": WORD}],
            }
        ]
    },
    "image": user([{"type": "image_url", "image_url": {"url": b64(WORD, "image/png")}}]),
    "pdf": user([{"type": "file", "file": {"file_data": b64(WORD, "application/pdf")}}]),
    "bare base64 (a PDF)": user([{"type": "file", "file": {"file_data": b64(WORD)[23:]}}]),
    "an accented spelling (another word)": user("lea\u0301k-this"),
}


@pytest.mark.parametrize("case", list(READ))
def test_every_text_a_model_reads_is_matched(case: str) -> None:
    rule = input_match(MATCHER, READ[case])
    assert rule is not None and rule.name == "inbound"


@pytest.mark.parametrize("case", list(NOT_READ))
def test_what_no_model_reads_is_not(case: str) -> None:
    assert input_match(MATCHER, NOT_READ[case]) is None


def test_the_first_match_names_its_filter() -> None:
    matcher = Matcher(
        [FilterSpec(name="a", patterns=("zzz",)), FilterSpec(name="b", regex=(r"\d{3}",))]
    )
    rule = input_match(matcher, user("call 123 then zzz"))
    assert rule is not None and rule.name == "b"
    rule = input_match(matcher, user("zzz then 123"))
    assert rule is not None and rule.name == "a"
