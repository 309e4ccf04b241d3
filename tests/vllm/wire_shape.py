"""The *shape* of an HTTP exchange with a vLLM-dialect server, for comparing two servers.

Pure: a captured :class:`Transcript` (status, media type, body) in, a :class:`Signature` out.
Two servers agree on an exchange when their signatures are equal; :func:`differences` says
where they do not, one line per difference, stable enough to list in a test's table of known
differences.

What a signature keeps:

- the status and the media type (``text/event-stream``, ``application/json``...);
- for a stream, the **order of chunk kinds** with repeats collapsed (two servers tokenize
  differently, so the number of deltas is not part of the dialect): ``role``, ``reasoning``,
  ``content``, ``tool_first`` (a tool call's first fragment, with ``id``), ``tool_args``,
  ``finish`` (the chunk with ``finish_reason``, after its own delta if that shows something),
  ``usage`` (``choices: []``), ``error`` and ``done`` (``data: [DONE]``);
- per kind, the union of the **key paths and value types** of its chunks: a delta kind is
  judged by its ``delta`` object, ``role``/``usage``/``error`` by the whole chunk, and the chunk
  around a delta by ``envelope:token`` or ``envelope:finish`` (the chunk without its delta);
- for a JSON body, the key paths and value types of the whole body;
- the **values** of a few keys that are part of the dialect (``object``, ``finish_reason``,
  ``type``, ``param``, error ``message``s...), with ids' random hex replaced by ``<hex>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import groupby
from typing import Any

Json = Any

# Keys whose (normalised) string value is part of the dialect, not just their type.
VALUE_KEYS = frozenset(
    {
        "object",
        "id",
        "system_fingerprint",
        "finish_reason",
        "role",
        "type",
        "param",
        "message",
        "model",
        "owned_by",
        "detail",
        "error",  # vLLM's 401 body: {"error": "Unauthorized"}
    }
)
_HEX = re.compile(r"[0-9a-f]{8,}")
DONE = "[DONE]"


@dataclass(frozen=True)
class Transcript:
    """What a server answered: status, media type, and the body (JSON, SSE data, or text)."""

    status: int
    media_type: str  # the content-type without parameters, lower case ("" if none)
    body: Json = None  # parsed JSON body (non-SSE); None when empty or not JSON
    events: tuple[Json, ...] | None = None  # SSE `data:` payloads: parsed JSON or "[DONE]"
    text: str = ""  # the raw body

    @classmethod
    def from_http(cls, status: int, content_type: str | None, text: str) -> Transcript:
        media_type = (content_type or "").split(";")[0].strip().lower()
        if media_type == "text/event-stream":
            return cls(status, media_type, events=tuple(parse_sse(text)), text=text)
        try:
            body = json.loads(text) if text.strip() else None
        except ValueError:
            body = None
        return cls(status, media_type, body=body, text=text)


def parse_sse(text: str) -> list[Json]:
    """The `data:` payloads of an SSE body, in order: parsed JSON, or the string "[DONE]"."""
    events: list[Json] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(
            line.removeprefix("data:").removeprefix(" ")
            for line in block.split("\n")
            if line.startswith("data:")
        )
        if not data:
            continue
        events.append(DONE if data == DONE else json.loads(data))
    return events


def _type_name(value: Json) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return {int: "int", float: "float", str: "str", list: "list", dict: "dict"}[type(value)]


def shape(value: Json, path: str = "$") -> frozenset[str]:
    """Every key path of `value` with its type (``$.choices[].index: int``); for the keys in
    VALUE_KEYS, strings also with their value, random hex replaced (``$.id: str = chatcmpl-<hex>``).
    List elements share one path (``[]``), so a list's length is not part of its shape."""
    out: set[str] = set()

    def walk(v: Json, p: str, key: str | None) -> None:
        kind = _type_name(v)
        if kind == "str" and key in VALUE_KEYS:
            out.add(f"{p}: str = {_HEX.sub('<hex>', v)}")
        else:
            out.add(f"{p}: {kind}")
        if isinstance(v, dict):
            for k, item in v.items():
                walk(item, f"{p}.{k}", k)
        elif isinstance(v, list):
            for item in v:
                walk(item, f"{p}[]", None)

    walk(value, path, None)
    return frozenset(out)


def _delta_kind(delta: Mapping[str, Json]) -> str | None:
    """What a delta shows, or None when it shows nothing."""
    if "role" in delta:
        return "role"
    calls = delta.get("tool_calls")
    if calls:
        return "tool_first" if any("id" in call for call in calls) else "tool_args"
    if delta.get("reasoning") or delta.get("reasoning_content"):
        return "reasoning"
    if delta.get("content"):
        return "content"
    return None


def chunk_parts(chunk: Json) -> list[tuple[str, str, Json]]:
    """A chunk as (kind for the order, shape key, the part judged under that key)."""
    if chunk == DONE:
        return [("done", "done", None)]
    if not isinstance(chunk, dict):
        return [("garbage", "garbage", chunk)]
    if "error" in chunk:
        return [("error", "error", chunk)]
    choices = chunk.get("choices")
    if not choices:
        bare = "usage" if chunk.get("usage") else "empty"
        return [(bare, bare, chunk)]
    choice = choices[0]
    delta = choice.get("delta") or {}
    kind = _delta_kind(delta)
    if kind == "role":
        return [("role", "role", chunk)]
    envelope = {**chunk, "choices": [{k: v for k, v in choice.items() if k != "delta"}]}
    parts: list[tuple[str, str, Json]] = []
    if kind is not None:
        parts.append((kind, kind, delta))
    if choice.get("finish_reason") is not None:
        parts.append(("finish", "envelope:finish", envelope))
        parts.append(("", "delta:finish", delta))  # what the last delta looks like
    else:
        parts.append(("", "envelope:token", envelope))
    return parts


@dataclass(frozen=True)
class Signature:
    status: int
    media_type: str
    order: tuple[str, ...]  # chunk kinds, repeats collapsed; () when not a stream
    shapes: Mapping[str, frozenset[str]]  # shape key -> key paths and types


def signature(transcript: Transcript) -> Signature:
    if transcript.events is None:
        body_shape = shape(transcript.body) if transcript.body is not None else frozenset()
        if transcript.body is None and transcript.text:
            body_shape = frozenset({f"$: text = {transcript.text[:200]}"})
        return Signature(transcript.status, transcript.media_type, (), {"body": body_shape})
    kinds: list[str] = []
    shapes: dict[str, set[str]] = {}
    for chunk in transcript.events:
        for kind, key, part in chunk_parts(chunk):
            if kind:
                kinds.append(kind)
            shapes.setdefault(key, set()).update(shape(part) if part is not None else ())
    order = tuple(kind for kind, _ in groupby(kinds))
    frozen = {key: frozenset(paths) for key, paths in shapes.items()}
    return Signature(transcript.status, transcript.media_type, order, frozen)


def differences(expected: Signature, actual: Signature) -> list[str]:
    """One line per difference, ``expected`` being the reference (real vLLM)."""
    out: list[str] = []
    if expected.status != actual.status:
        out.append(f"status: {expected.status} != {actual.status}")
    if expected.media_type != actual.media_type:
        out.append(f"media type: {expected.media_type} != {actual.media_type}")
    if expected.order != actual.order:
        out.append(f"order: {' '.join(expected.order)} != {' '.join(actual.order)}")
    for key in sorted(set(expected.shapes) | set(actual.shapes)):
        ours = expected.shapes.get(key, frozenset())
        theirs = actual.shapes.get(key, frozenset())
        out.extend(f"{key}: only reference: {p}" for p in sorted(ours - theirs))
        out.extend(f"{key}: only candidate: {p}" for p in sorted(theirs - ours))
    return out


def kinds_of(events: Iterable[Json]) -> tuple[str, ...]:
    """The collapsed order of chunk kinds alone (for assertions on one server)."""
    kinds = [kind for chunk in events for kind, _, _ in chunk_parts(chunk) if kind]
    return tuple(kind for kind, _ in groupby(kinds))
