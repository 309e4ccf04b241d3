"""``POST /v1/responses`` reads its body as the API does (issue 39, item 5): every field's type
checked, ``metadata`` within the API's bounds, each refusal naming the param as the client sent
it (``max_output_tokens``, ``input[1].type``), in the API's words, and nothing the client sent
rewritten into something else; nothing refused reaches the simulator or the store."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.harness import Stack, script

TIMEOUT_S = 10
SAID = script({"text": "ok"})
CALL: Any = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
TOOLS: Any = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]


def seventeen() -> dict[str, str]:
    return {f"k{i}": "v" for i in range(17)}


REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "store a string",
        {"store": "no"},
        "store",
        "Invalid type for 'store': expected a boolean, but got a string instead.",
    ),
    (
        "stream a string",
        {"stream": "yes"},
        "stream",
        "Invalid type for 'stream': expected a boolean, but got a string instead.",
    ),
    (
        "metadata an array",
        {"metadata": [1]},
        "metadata",
        "Invalid type for 'metadata': expected an object, but got an array instead.",
    ),
    (
        "a metadata value past 512 characters",
        {"metadata": {"k": "x" * 100_000}},
        "metadata.k",
        "Invalid 'metadata.k': string too long. Expected a string with maximum length 512, "
        "but got a string with length 100000 instead.",
    ),
    (
        "a metadata value not a string",
        {"metadata": {"k": 7}},
        "metadata.k",
        "Invalid type for 'metadata.k': expected a string, but got an integer instead.",
    ),
    (
        "seventeen metadata pairs",
        {"metadata": seventeen()},
        "metadata",
        "Invalid 'metadata': too many properties. Expected an object with at most 16 "
        "properties, but got an object with 17 properties instead.",
    ),
    (
        "a metadata key past 64 characters",
        {"metadata": {"k" * 70: "v"}},
        "metadata." + "k" * 70,
        f"Invalid property name in 'metadata': '{'k' * 70}' is too long. Expected a string "
        "with maximum length 64, but got a string with length 70 instead.",
    ),
    (
        "max_output_tokens below the API's floor",
        {"max_output_tokens": 5},
        "max_output_tokens",
        "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, "
        "but got 5 instead.",
    ),
    (
        "max_output_tokens a string",
        {"max_output_tokens": "many"},
        "max_output_tokens",
        "Invalid type for 'max_output_tokens': expected an integer, but got a string instead.",
    ),
    (
        "an item's type a number",
        {"input": [{"role": "user", "content": "x"}, {"type": 5}]},
        "input[1].type",
        "Invalid type for 'input[1].type': expected a string, but got an integer instead.",
    ),
    (
        "an item not an object",
        {"input": ["x"]},
        "input[0]",
        "Invalid type for 'input[0]': expected an input item, but got a string instead.",
    ),
    (
        "function_call arguments an object",
        {"input": [{"role": "user", "content": "x"}, {**CALL, "arguments": {"a": 1}}]},
        "input[1].arguments",
        "Invalid type for 'input[1].arguments': expected a string, but got an object instead.",
    ),
    (
        "function_call without arguments",
        {"input": [{"role": "user", "content": "x"}, {**CALL, "arguments": None}]},
        "input[1].arguments",
        "Invalid type for 'input[1].arguments': expected a string, but got null instead.",
    ),
    (
        "temperature past 2",
        {"temperature": 3},
        "temperature",
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, "
        "but got 3 instead.",
    ),
    (
        "parallel_tool_calls a string",
        {"parallel_tool_calls": "yes", "tools": TOOLS},
        "parallel_tool_calls",
        "Invalid type for 'parallel_tool_calls': expected a boolean, but got a string instead.",
    ),
    (
        "previous_response_id a number",
        {"previous_response_id": 7},
        "previous_response_id",
        "Invalid type for 'previous_response_id': expected a string, but got an integer instead.",
    ),
    (
        "a function tool's name off the API's pattern",
        {"tools": [{"type": "function", "name": "has space"}]},
        "tools[0].name",
        "Invalid 'tools[0].name': string does not match pattern. Expected a string that "
        "matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.",
    ),
    (
        "text.verbosity off the list",
        {"text": {"verbosity": "loud"}},
        "text.verbosity",
        "Invalid value: 'loud'. Supported values are: 'low', 'medium' and 'high'.",
    ),
    (
        "reasoning.summary off the list",
        {"reasoning": {"summary": "everything"}},
        "reasoning.summary",
        "Invalid value: 'everything'. Supported values are: 'auto', 'concise', 'detailed' "
        "and 'none'.",
    ),
]


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
async def test_a_body_the_api_refuses_is_refused_naming_its_param(
    stack: Stack, fields: dict[str, Any], param: str, message: str
) -> None:
    body = {"model": "agent-lite", "input": SAID, **fields}
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        answer = await client.post(stack.v1 + "/responses", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["message"]) == (param, message)
    assert error["type"] == "invalid_request_error"
    assert (await stack.sim_stats())["requests"] == 0


async def test_sixteen_metadata_pairs_at_their_bounds_are_kept(stack: Stack) -> None:
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        made = await client.post(
            stack.v1 + "/responses",
            json={"model": "agent-lite", "input": SAID, "metadata": metadata},
        )
        assert made.status_code == 200, made.text
        assert made.json()["metadata"] == metadata
        got = await client.get(stack.v1 + f"/responses/{made.json()['id']}")
    assert got.json()["metadata"] == metadata
