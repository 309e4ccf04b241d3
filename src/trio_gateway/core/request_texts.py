"""Every text of a request that a model reads: what input filters match (``core/filters.py``).
Pure.

The body is the chat-shaped one every front makes (Messages and Responses requests are
translated to it first), or a completion's or embeddings' body. What a model reads:

- each message's content (a string, or its parts' ``text`` and ``refusal``), its ``name``, an
  assistant's ``reasoning_content`` / ``reasoning``, its ``refusal``, its tool calls' names and
  arguments (and a legacy ``function_call``'s), its ``reasoning_details`` texts and summaries;
- a file part's text (``file.file_data`` a base64 data URL of any type but images, audio, video
  and PDF, decoded as UTF-8) and its ``filename``;
- each tool's (and legacy function's) name, description and parameter schema, and a
  ``response_format``'s schema with its name and description: in a schema, every key and
  every string (property names, descriptions, enums, titles...);
- everything else the body carries, as strings (a completion's ``prompt`` and ``suffix``,
  embeddings' ``input``, fields passed through to vLLM such as ``chat_template_kwargs``).

Not read, so not matched: ids, roles, types, the model and routing fields, sampling settings,
``metadata``, ``user``, stop sequences, signatures and encrypted reasoning, images, audio and PDF
files (their text is the vendor's to extract).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Mapping
from typing import Any, Final

from trio_gateway.core.media_tokens import data_url
from trio_gateway.core.request import GATEWAY_FIELDS

# Top-level fields no model reads as text.
NOT_READ: Final = frozenset(
    {
        "model",
        "user",
        "metadata",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "prompt_cache_key",
        "safety_identifier",
        "logit_bias",
        "modalities",
        "reasoning_effort",
        "verbosity",
        "tool_choice",
        "function_call",
        "encoding_format",
        "audio",
        *GATEWAY_FIELDS,
    }
)
# A message's fields that are not text: who sent it and what it answers.
_MESSAGE_NOT_READ: Final = frozenset({"role", "tool_call_id", "audio"})
# Media the gateway does not read: their text, if any, is the vendor's to extract.
_NOT_TEXT_MEDIA: Final = ("image/", "audio/", "video/", "application/pdf")


def request_texts(body: Mapping[str, object]) -> Iterator[str]:
    """Every text of the request a model reads (see the module)."""
    for key, value in body.items():
        if key in NOT_READ:
            continue
        if key == "messages" and isinstance(value, list):
            for message in value:
                if isinstance(message, dict):
                    yield from _message(message)
        elif key in ("tools", "functions") and isinstance(value, list):
            for tool in value:
                if isinstance(tool, dict):
                    function = tool.get("function", tool)
                    yield from _schema(function if isinstance(function, dict) else tool)
        elif key == "response_format" and isinstance(value, dict):
            yield from _schema(value.get("json_schema"))
        else:
            yield from _strings(value)


def _message(message: dict[str, Any]) -> Iterator[str]:
    for key, value in message.items():
        if key in _MESSAGE_NOT_READ:
            continue
        if key == "content" and isinstance(value, list):
            for part in value:
                if isinstance(part, dict):
                    yield from _part(part)
        elif key == "tool_calls" and isinstance(value, list):
            for call in value:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    yield from _strings([function.get("name"), function.get("arguments")])
        elif key == "reasoning_details" and isinstance(value, list):
            for entry in value:
                if isinstance(entry, dict):
                    yield from _strings([entry.get("text"), entry.get("summary")])
        else:
            yield from _strings(value)


def _part(part: dict[str, Any]) -> Iterator[str]:
    kind = part.get("type")
    if kind in ("image_url", "input_audio"):
        return
    if kind == "file":
        file = part.get("file")
        if isinstance(file, dict):
            yield from _strings(file.get("filename"))
            text = file_text(file.get("file_data"))
            if text is not None:
                yield text
        return
    yield from _strings({k: v for k, v in part.items() if k != "type"})


def file_text(data: object) -> str | None:
    """A file part's ``file_data`` as text, when it is text: a base64 data URL of a type that
    is not an image, audio, video or PDF (bare base64 is a PDF, as OpenAI takes it)."""
    if not isinstance(data, str):
        return None
    found = data_url(data, "application/pdf")
    if found is None or found[0].startswith(_NOT_TEXT_MEDIA):
        return None
    try:
        raw = base64.b64decode(found[1], validate=True)
    except (binascii.Error, ValueError):
        return None  # not a file the vendor takes either: the provider refuses it
    return raw.decode("utf-8", "replace")


def _strings(value: object) -> Iterator[str]:
    """Every string in ``value``, however deep (without recursion: a body may nest deep)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(reversed(item.values()))
        elif isinstance(item, list):
            stack.extend(reversed(item))


def _schema(value: object) -> Iterator[str]:
    """Every key and string of a tool's or a response format's definition and its schema."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for key, sub in reversed(item.items()):
                stack.append(sub)
                stack.append(key)
        elif isinstance(item, list):
            stack.extend(reversed(item))
