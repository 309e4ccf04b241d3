"""Small pure pieces every vendor dialect needs: data URLs, generated tool-call ids, the
reasoning-effort scale, finish reasons. No vendor specifics here."""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
from typing import Any

import attrs

from trio_gateway.core.errors import InvalidRequest

_DATA_URL = re.compile(
    r"data:(?P<mime>[\w.+-]+/[\w.+-]+)(?:;[\w.+-]+=[\w.+-]+)*;base64,(?P<data>.*)", re.DOTALL
)

# A client says reasoning on/off and perhaps an effort; vendors that take a token budget get
# this many thinking tokens per effort (Anthropic needs at least 1024).
EFFORT_BUDGET_TOKENS = {
    "minimal": 1024,
    "low": 2048,
    "medium": 8192,
    "high": 16384,
    "xhigh": 32768,
}
DEFAULT_EFFORT = "medium"


@attrs.frozen
class InlineData:
    mime_type: str
    data: str  # base64, as it came


def parse_data_url(url: str, *, param: str) -> InlineData | None:
    """``data:image/png;base64,...`` → its type and payload; None for an ordinary URL.

    A ``data:`` URL that is not base64, or whose payload does not decode, is the client's error.
    """
    if not url.startswith("data:"):
        return None
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise InvalidRequest("expected a base64 data URL (data:<type>;base64,...)", param=param)
    data = match.group("data")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("the data URL's payload is not valid base64", param=param) from None
    return InlineData(mime_type=match.group("mime"), data=data)


def new_tool_call_id() -> str:
    """An id for a tool call whose vendor gives none: unique, and the same in every fragment
    and in the assembled call because the parser makes it once per call."""
    return "call_" + secrets.token_hex(12)


def budget_for(effort: str | None) -> int:
    return EFFORT_BUDGET_TOKENS.get(effort or DEFAULT_EFFORT, EFFORT_BUDGET_TOKENS[DEFAULT_EFFORT])


def tool_arguments_object(arguments: str, *, param: str) -> dict[str, Any]:
    """An assistant tool call's ``arguments`` string → the object vendors want as input.

    An empty string is no arguments (``{}``); anything that is not a JSON object is the client's
    error, since no vendor can be handed a half-parsed call.
    """
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise InvalidRequest(
            f"tool call arguments are not valid JSON: {exc}", param=param
        ) from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("tool call arguments must be a JSON object", param=param)
    return parsed


def content_texts(content: object) -> list[str]:
    """The texts of a message whose content is a string or a list of text parts, in order,
    empty ones left out (several vendors reject an empty text block)."""
    if isinstance(content, str):
        return [content] if content else []
    if not isinstance(content, list):
        return []
    texts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            text = part.get("text")
            if isinstance(text, str) and text:
                texts.append(text)
    return texts


def stop_sequences(stop: object) -> list[str]:
    """OpenAI's ``stop`` (a string, a list of strings, or null) as a list."""
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list):
        return [s for s in stop if isinstance(s, str)]
    return []


# Image types every vision vendor reads, by the URL path's extension. A fixed table rather than
# `mimetypes`, whose answers depend on the host's /etc/mime.types.
IMAGE_EXTENSION_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
    "gif": "image/gif",
    "heic": "image/heic",
    "heif": "image/heif",
}


def image_type_from_url(url: str) -> str | None:
    """The image type an http(s) URL's path names by its extension (query and fragment
    ignored, case-insensitive); None when the path has no known image extension."""
    path = url.split("#", 1)[0].split("?", 1)[0]
    name = path.rsplit("/", 1)[-1]
    if "." not in name:
        return None
    return IMAGE_EXTENSION_TYPES.get(name.rsplit(".", 1)[-1].lower())


# What credentials look like when an upstream quotes them back in an error message: Google API
# keys, Google OAuth2 access tokens, JWTs (a signed grant), and sk- style keys (OpenAI,
# Anthropic). Redacted before a message is kept, logged or shown to a client.
_CREDENTIAL = re.compile(
    r"AIza[0-9A-Za-z_-]{20,}"
    r"|ya29\.[0-9A-Za-z_.-]+"
    r"|eyJ[0-9A-Za-z_-]+\.[0-9A-Za-z_-]+\.[0-9A-Za-z_-]*"
    r"|sk-[0-9A-Za-z_-]{16,}"
)
REDACTED = "[redacted]"


def redact_credentials(text: str) -> str:
    """``text`` with anything that looks like a key, a token or a signed JWT replaced."""
    return _CREDENTIAL.sub(REDACTED, text)


def without_reasoning_details(messages: object) -> object:
    """``messages`` without the gateway's ``reasoning_details`` extension, for an upstream that
    speaks OpenAI's chat (OpenAI refuses fields it does not know; no vLLM template reads them):
    the same list when no message has them, else a copy (the client's body is never changed)."""
    if not isinstance(messages, list) or not any(
        isinstance(m, dict) and "reasoning_details" in m for m in messages
    ):
        return messages
    return [
        {k: v for k, v in m.items() if k != "reasoning_details"} if isinstance(m, dict) else m
        for m in messages
    ]
