"""Input filters read every text a model reads, on every front, whatever its spelling (issue 40,
item 6): each request here carries the input filter's word (``leak-this``, case-sensitive) in
one place a model reads, or spelled so that it reads the same (full-width letters, a zero-width
space inside), and each is refused before anything is sent upstream."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from tests.e2e.harness import Stack, chat
from tests.e2e.test_filters import TIMEOUT_S, matches, stack

__all__ = ["stack"]  # the fixture, shared with test_filters.py

WORD = "leak-this"
FULL_WIDTH = "".join(chr(ord(c) + 0xFEE0) if c != "-" else c for c in WORD)
ZERO_WIDTH = "leak\u200b-th\u200dis"
SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "description": "a " + WORD}}}
TEXT_FILE = "data:text/plain;base64," + base64.b64encode(f"notes: {WORD}\n".encode()).decode()


def _chat(**fields: Any) -> tuple[str, dict[str, Any]]:
    return "/chat/completions", chat("hello", **fields)


CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat tool description": _chat(
        tools=[{"type": "function", "function": {"name": "save", "description": WORD}}]
    ),
    "chat tool parameter description": _chat(
        tools=[{"type": "function", "function": {"name": "save", "parameters": SCHEMA}}]
    ),
    "assistant reasoning_content": (
        "/chat/completions",
        {
            "model": "agent-lite",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok", "reasoning_content": "I " + WORD},
                {"role": "user", "content": "go on"},
            ],
        },
    ),
    "response_format schema description": _chat(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "out", "description": WORD, "schema": {"type": "object"}},
        }
    ),
    "full-width letters": _chat(messages=[{"role": "user", "content": f"say {FULL_WIDTH}"}]),
    "zero-width characters inside": _chat(
        messages=[{"role": "user", "content": f"say {ZERO_WIDTH}"}]
    ),
    "messages tool description": (
        "/messages",
        {
            "model": "agent-lite",
            "max_tokens": 50,
            "tools": [{"name": "save", "description": WORD, "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "hello"}],
        },
    ),
    "responses input_file text": (
        "/responses",
        {
            "model": "agent-lite",
            "store": False,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "read this"},
                        {"type": "input_file", "filename": "a.txt", "file_data": TEXT_FILE},
                    ],
                }
            ],
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_word_anywhere_a_model_reads_is_refused(stack: Stack, case: str) -> None:
    path, body = CASES[case]
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.post(stack.v1 + path, json=body)
    assert response.status_code == 400, response.text
    assert "inbound" in response.text
    assert stack.sim.engine.stats().requests == 0
    assert matches(stack, "inbound", "refuse") == 1


async def test_the_same_requests_without_the_word_are_served(stack: Stack) -> None:
    """The refusals above are the word's doing: each body with the word replaced is answered."""
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        for case, (path, body) in CASES.items():
            clean = _replace(body)
            response = await client.post(stack.v1 + path, json=clean)
            assert response.status_code == 200, (case, response.text)


def _replace(value: Any) -> Any:
    if isinstance(value, str):
        if value.startswith("data:text/plain;base64,"):
            return "data:text/plain;base64," + base64.b64encode(b"notes: nothing\n").decode()
        for word in (WORD, FULL_WIDTH, ZERO_WIDTH):
            value = value.replace(word, "nothing")
        return value
    if isinstance(value, dict):
        return {k: _replace(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v) for v in value]
    return value
