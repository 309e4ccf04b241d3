"""The prompt tokens a vendor counts for an image, an audio clip or a file. Pure.

Media in a prompt is counted by each vendor's documented rule, never by the length of its
base64 (a 1 MB image is some 1,400,000 characters, 340,000 "tokens" at four characters each:
a whole minute of a key's `tpm`; the vendor counts it as 765 to 1,600). The size an image, the
length a clip, the pages a PDF has come from the payload's own header (``media_headers.py``);
what cannot be read (a remote URL, an undecodable payload, a ``file_id``) is counted at the
vendor's maximum. The rules and their sources are in docs/accounting.md ("The prompt
estimate"); a provider type with no rule of its own (``openai_compatible``: the served model
decides) counts the most of the three.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from trio_gateway.core.media_headers import (
    MAX_HEADER_BASE64,
    audio_seconds,
    decode_head,
    decoded_length,
    image_size,
    pdf_pages,
)

Vendor = Literal["openai", "anthropic", "gemini"]
# Base64 characters decoded first when looking for a header (the whole limit only if needed).
FIRST_READ_BASE64: Final = 4096
VENDORS: Final[tuple[Vendor, ...]] = ("openai", "anthropic", "gemini")
_OF_TYPE: Final[Mapping[str, tuple[Vendor, ...]]] = {
    "openai": ("openai",),
    "anthropic": ("anthropic",),
    "gemini": ("gemini",),
    "vertex": ("gemini",),
}

# OpenAI (platform.openai.com/docs/guides/images-vision#calculating-costs): `low` detail is 85;
# otherwise the image is fit in 2048 x 2048, its short side brought down to 768, and each
# 512 px tile costs 170 on top of 85. At most 8 tiles (768 x 2048).
OPENAI_IMAGE_BASE: Final = 85
OPENAI_IMAGE_TILE: Final = 170
OPENAI_IMAGE_MAX: Final = OPENAI_IMAGE_BASE + 8 * OPENAI_IMAGE_TILE
# Anthropic (docs.claude.com/en/docs/build-with-claude/vision#calculate-image-costs):
# width x height / 750, after a long edge over 1568 px is scaled down; about 1,600 at most.
ANTHROPIC_PIXELS_PER_TOKEN: Final = 750
ANTHROPIC_LONG_EDGE: Final = 1568
ANTHROPIC_IMAGE_MAX: Final = 1600
# Gemini (ai.google.dev/gemini-api/docs/tokens): 258 for an image of at most 384 px each way,
# else 258 per 768 px tile. Google documents no largest image: the gateway counts at most 16
# tiles (a 3072 px square), which is also what an image of unknown size counts.
GEMINI_IMAGE_TILE: Final = 258
GEMINI_IMAGE_MAX: Final = 16 * GEMINI_IMAGE_TILE

# Audio, per second: Gemini 32 (ai.google.dev/gemini-api/docs/tokens); OpenAI 10, one token
# per 100 ms of user audio (platform.openai.com/docs/guides/realtime-costs). Anthropic reads no
# audio: the dialect refuses it before anything is sent.
AUDIO_TOKENS_PER_S: Final[Mapping[Vendor, int]] = {"openai": 10, "anthropic": 0, "gemini": 32}
# A clip whose header says nothing lasts at most as long as its bytes at 8 kbit/s, the lowest
# MP3 bit rate.
LOWEST_AUDIO_BYTES_PER_S: Final = 1000

# PDF pages: Anthropic up to 3,000 each, at most 100 pages (docs.claude.com/en/docs/
# build-with-claude/pdf-support); Gemini 258 each, at most 1,000 (ai.google.dev/gemini-api/docs/
# document-processing); OpenAI gives the model each page's text and an image of it
# (platform.openai.com/docs/guides/pdf-files) and documents no count: counted as Anthropic's.
PDF_PAGE_TOKENS: Final[Mapping[Vendor, int]] = {"openai": 3000, "anthropic": 3000, "gemini": 258}
PDF_MAX_PAGES: Final[Mapping[Vendor, int]] = {"openai": 100, "anthropic": 100, "gemini": 1000}
# Any other file is read as text: the usual four bytes a token.
_TEXT_BYTES_PER_TOKEN: Final = 4


@attrs.frozen(kw_only=True)
class Media:
    """One media part of a prompt, as far as its header tells; None is "could not tell"."""

    kind: Literal["image", "audio", "pdf", "text"]
    size: tuple[int, int] | None = None
    detail: str | None = None
    seconds: float | None = None
    pages: int | None = None
    nbytes: int = 0


def data_url(url: str, default_type: str) -> tuple[str, str] | None:
    """A data URL (or bare base64) → (its type, its base64 payload); None for a plain URL."""
    if not url.startswith("data:"):
        return (default_type, url) if default_type else None
    header, _, data = url.partition(",")
    if ";base64" not in header:
        return None
    return header[5:].split(";", 1)[0].lower() or default_type, data


def _image(data: str | None, detail: str | None) -> Media:
    size = None if data is None else _size_of(data)
    return Media(kind="image", size=size, detail=detail)


def _size_of(data: str) -> tuple[int, int] | None:
    # Most headers are in the first bytes; only a JPEG behind large metadata needs more.
    for limit in (FIRST_READ_BASE64, MAX_HEADER_BASE64):
        head = decode_head(data, limit)
        if head is None:
            return None
        if (size := image_size(head)) is not None or len(head) < limit * 3 // 4:
            return size
    return None


def _audio(data: str) -> Media:
    total = decoded_length(data)
    seconds = None
    for limit in (FIRST_READ_BASE64, MAX_HEADER_BASE64):
        head = decode_head(data, limit)
        if head is None:
            break
        seconds = audio_seconds(head, total)
        if seconds is not None or len(head) < limit * 3 // 4:
            break
    if seconds is None:
        seconds = total / LOWEST_AUDIO_BYTES_PER_S
    return Media(kind="audio", seconds=seconds)


def _file(file: Mapping[str, Any]) -> Media:
    data = file.get("file_data")
    if not isinstance(data, str):
        return Media(kind="pdf")  # a file_id: nothing to read, the vendor's maximum
    # OpenAI's file parts hold PDFs, as a data URL or as bare base64.
    found = data_url(data, "application/pdf")
    if found is None:
        return Media(kind="pdf")
    mime, payload = found
    if mime.startswith("image/"):
        return _image(payload, None)
    if mime.startswith("audio/"):
        return _audio(payload)
    if mime != "application/pdf":
        return Media(kind="text", nbytes=decoded_length(payload))
    try:
        pdf = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return Media(kind="pdf")
    return Media(kind="pdf", pages=pdf_pages(pdf))


def describe(part: object) -> Media | None:
    """The media a content part holds; None for text (and anything that is not media)."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "image_url" and isinstance(image := part.get("image_url"), dict):
        url = image.get("url")
        detail = image.get("detail") if isinstance(image.get("detail"), str) else None
        found = data_url(url, "") if isinstance(url, str) else None
        return _image(None if found is None else found[1], detail)
    if kind == "input_audio" and isinstance(audio := part.get("input_audio"), dict):
        data = audio.get("data")
        return _audio(data if isinstance(data, str) else "")
    if kind == "file" and isinstance(file := part.get("file"), dict):
        return _file(file)
    return None


def _openai_image(size: tuple[int, int] | None, detail: str | None) -> int:
    if detail == "low":
        return OPENAI_IMAGE_BASE
    if size is None:
        return OPENAI_IMAGE_MAX
    width, height = float(size[0]), float(size[1])
    if detail != "original":  # "original" is sent at its own size
        fit = min(1.0, 2048 / max(width, height))
        width, height = width * fit, height * fit
        short = min(width, height)
        if short > 768:
            width, height = width * 768 / short, height * 768 / short
    tiles = math.ceil(width / 512) * math.ceil(height / 512)
    return OPENAI_IMAGE_BASE + OPENAI_IMAGE_TILE * tiles


def _anthropic_image(size: tuple[int, int] | None) -> int:
    if size is None:
        return ANTHROPIC_IMAGE_MAX
    width, height = size
    fit = min(1.0, ANTHROPIC_LONG_EDGE / max(width, height))
    tokens = math.ceil(width * fit * height * fit / ANTHROPIC_PIXELS_PER_TOKEN)
    return min(tokens, ANTHROPIC_IMAGE_MAX)


def _gemini_image(size: tuple[int, int] | None) -> int:
    if size is None:
        return GEMINI_IMAGE_MAX
    width, height = size
    if width <= 384 and height <= 384:
        return GEMINI_IMAGE_TILE
    tiles = math.ceil(width / 768) * math.ceil(height / 768)
    return min(tiles * GEMINI_IMAGE_TILE, GEMINI_IMAGE_MAX)


def vendor_tokens(media: Media, vendor: Vendor) -> int:
    """The prompt tokens ``vendor`` counts for ``media``."""
    if media.kind == "image":
        if vendor == "openai":
            return _openai_image(media.size, media.detail)
        if vendor == "anthropic":
            return _anthropic_image(media.size)
        return _gemini_image(media.size)
    if media.kind == "audio":
        return math.ceil((media.seconds or 0.0) * AUDIO_TOKENS_PER_S[vendor])
    if media.kind == "pdf":
        pages = media.pages if media.pages is not None else PDF_MAX_PAGES[vendor]
        return min(pages, PDF_MAX_PAGES[vendor]) * PDF_PAGE_TOKENS[vendor]
    return -(-media.nbytes // _TEXT_BYTES_PER_TOKEN)


def vendors_of(provider_type: str | None) -> tuple[Vendor, ...]:
    """Whose rules count for a provider type: its vendor's; all three for a type without
    rules of its own (``openai_compatible``) or none known yet."""
    return _OF_TYPE.get(provider_type or "", VENDORS)


def split_media(messages: list[Any]) -> tuple[list[Any], list[Media]]:
    """The messages with each media part replaced by a stub of its type (what is left is
    counted as text), and the media found. Messages without media are not copied."""
    found: list[Media] = []
    out = messages
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        parts = [describe(part) for part in content]
        if not any(parts):
            continue
        if out is messages:
            out = list(messages)
        stubbed = [
            part if media is None else {"type": part["type"]}
            for part, media in zip(content, parts, strict=True)
        ]
        out[i] = {**message, "content": stubbed}
        found.extend(media for media in parts if media is not None)
    return out, found
