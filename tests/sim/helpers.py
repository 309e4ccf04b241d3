"""Reading the real vLLM transcripts in tests/sim/fixtures/vllm-0.32.0 and small test tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm-0.32.0"


def fixture_text(name: str) -> tuple[list[str], str]:
    """The `# ` header lines (without the marker) and the rest of a fixture file."""
    headers: list[str] = []
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines(keepends=True)
    while lines and lines[0].startswith("# "):
        headers.append(lines.pop(0)[2:].rstrip("\n"))
    return headers, "".join(lines)


def fixture_request(name: str) -> dict[str, Any]:
    headers, _ = fixture_text(name)
    for line in headers:
        if line.startswith("request: {"):
            value: dict[str, Any] = json.loads(line.removeprefix("request: "))
            return value
    raise LookupError(f"{name} records no JSON request")


def fixture_json(name: str) -> Any:
    return json.loads(fixture_text(name)[1])


def sse_payloads(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, as raw strings, `[DONE]` included."""
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def fixture_events(name: str) -> list[str]:
    return sse_payloads(fixture_text(name)[1])


def misc_errors() -> dict[str, tuple[int, str]]:
    """misc_errors.txt: section title -> (status, body) for the sections that have a body."""
    out: dict[str, tuple[int, str]] = {}
    title = ""
    for line in fixture_text("misc_errors.txt")[1].splitlines():
        if line.startswith("## "):
            title = line[3:]
        elif line.startswith("{") and title not in out:
            body, _, status = line.rpartition(" HTTP ")
            out[title] = (int(status), body)
    return out


def key_tree(value: Any) -> Any:
    """The key structure of a JSON value, key order included, values dropped."""
    if isinstance(value, dict):
        return [(key, key_tree(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [key_tree(item) for item in value]
    return None


def ordered(value: Any) -> Any:
    """A JSON value with dicts turned into item lists, so == also compares key order."""
    if isinstance(value, dict):
        return [(key, ordered(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [ordered(item) for item in value]
    return value
