"""Reading the real vLLM transcripts in tests/fixtures (copied from shared/fixtures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"


def transcript(name: str) -> tuple[dict[str, Any] | None, bytes]:
    """The request (from the ``# request:`` header, when it is JSON) and the raw body."""
    request = None
    body_lines = []
    for line in (FIXTURES / name).read_bytes().splitlines(keepends=True):
        if line.startswith(b"# request: "):
            try:
                request = json.loads(line[len(b"# request: ") :])
            except ValueError:
                request = None
        elif not line.startswith(b"# "):
            body_lines.append(line)
    body = b"".join(body_lines)
    if body.startswith(b"data:") and b"\n\n" not in body:
        # The .txt captures kept one `data:` line per event and dropped the blank lines.
        body = body.replace(b"\n", b"\n\n")
    return request, body
