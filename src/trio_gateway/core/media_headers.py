"""What a media payload's own header says of it: an image's size, an audio clip's length, a
PDF's pages. Pure, bounded, and never trusting: a header that does not parse is "unknown"
(None), never an exception, so the caller counts the vendor's maximum instead.

Only the first :data:`MAX_HEADER_BASE64` characters of an image or audio payload are decoded
(an image's size sits in its first bytes; a JPEG's after its metadata segments, which rarely
pass 64 KiB); a PDF is read whole (the request body that holds it is bounded by
``server.max_body_bytes``), and of its compressed object streams at most
:data:`MAX_PDF_INFLATED` bytes are inflated.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
import zlib
from typing import Final

# Base64 characters decoded to find an image's size or an audio clip's format (192 KiB).
MAX_HEADER_BASE64: Final = 256 * 1024
# Bytes of a PDF's object streams inflated in all, and how many streams: a zip bomb stops here.
MAX_PDF_INFLATED: Final = 16 * 1024 * 1024
MAX_PDF_OBJECT_STREAMS: Final = 256

_PNG: Final = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers: every SOFn but DHT (C4), JPG (C8) and DAC (CC).
_JPEG_SOF: Final = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length: TEM, RST0-7, SOI.
_JPEG_BARE: Final = frozenset({0x01, 0xD8, *range(0xD0, 0xD8)})

# MPEG audio layer III bit rates (kbit/s) by the header's index: MPEG-1, then MPEG-2 and 2.5.
_MP3_RATES_V1: Final = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)
_MP3_RATES_V2: Final = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)

_PDF_PAGE: Final = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_PDF_OBJECT_STREAM: Final = re.compile(rb"/Type\s*/ObjStm(?![A-Za-z])")
_PDF_STREAM: Final = re.compile(rb"stream\r?\n")


def decode_head(data: str, limit: int = MAX_HEADER_BASE64) -> bytes | None:
    """The first bytes of a base64 payload (at most ``limit`` characters of it decoded)."""
    head = data[:limit]
    head = head[: len(head) - len(head) % 4]
    try:
        return base64.b64decode(head, validate=True)
    except (binascii.Error, ValueError):
        return None


def decoded_length(data: str) -> int:
    """The bytes a base64 payload decodes to, from its length alone."""
    return len(data) * 3 // 4 - data[-2:].count("=")


def image_size(head: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, GIF, WebP or JPEG header; None for anything else."""
    size = _png(head) or _gif(head) or _webp(head) or _jpeg(head)
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return size


def _png(head: bytes) -> tuple[int, int] | None:
    if head[:8] != _PNG or head[12:16] != b"IHDR" or len(head) < 24:
        return None
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def _gif(head: bytes) -> tuple[int, int] | None:
    if head[:6] not in (b"GIF87a", b"GIF89a") or len(head) < 10:
        return None
    width, height = struct.unpack("<HH", head[6:10])
    return width, height


def _webp(head: bytes) -> tuple[int, int] | None:
    if head[:4] != b"RIFF" or head[8:12] != b"WEBP" or len(head) < 30:
        return None
    chunk = head[12:16]
    if chunk == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", head[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and head[20] == 0x2F:
        b = head[21:25]
        width = 1 + (((b[1] & 0x3F) << 8) | b[0])
        height = 1 + (((b[3] & 0x0F) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6))
        return width, height
    if chunk == b"VP8X":
        width = 1 + int.from_bytes(head[24:27], "little")
        height = 1 + int.from_bytes(head[27:30], "little")
        return width, height
    return None


def _jpeg(head: bytes) -> tuple[int, int] | None:
    if head[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 9 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _JPEG_BARE:
            i += 2
            continue
        if marker in _JPEG_SOF:
            height, width = struct.unpack(">HH", head[i + 5 : i + 9])
            return width, height
        (length,) = struct.unpack(">H", head[i + 2 : i + 4])
        if length < 2:
            return None
        i += 2 + length
    return None


def audio_seconds(head: bytes, total_bytes: int) -> float | None:
    """How long a WAV or MP3 clip of ``total_bytes`` plays, from its header; None when the
    header says nothing (an MP3 whose first frame is past ``head``, another format)."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return _wav_seconds(head, total_bytes)
    return _mp3_seconds(head, total_bytes)


def _wav_seconds(head: bytes, total_bytes: int) -> float | None:
    byte_rate = 0
    i = 12
    while i + 8 <= len(head):
        chunk, size = head[i : i + 4], int.from_bytes(head[i + 4 : i + 8], "little")
        if chunk == b"fmt " and i + 20 <= len(head):
            byte_rate = int.from_bytes(head[i + 16 : i + 20], "little")
        elif chunk == b"data" and byte_rate > 0:
            # The data's length from the payload's, not the header's: a streamed WAV says
            # 0xFFFFFFFF there.
            return (total_bytes - i - 8) / byte_rate
        i += 8 + size + (size & 1)
    return total_bytes / byte_rate if byte_rate > 0 else None


def _mp3_seconds(head: bytes, total_bytes: int) -> float | None:
    i = 0
    if head[:3] == b"ID3" and len(head) >= 10:
        # ID3v2: a syncsafe size (7 bits per byte) after a 10-byte header.
        size = 0
        for byte in head[6:10]:
            size = (size << 7) | (byte & 0x7F)
        i = 10 + size
    if i + 3 > len(head) or head[i] != 0xFF or head[i + 1] & 0xE0 != 0xE0:
        return None
    version, layer = (head[i + 1] >> 3) & 0x3, (head[i + 1] >> 1) & 0x3
    if layer != 1 or version == 1:  # layer III only; version 1 is reserved
        return None
    rates = _MP3_RATES_V1 if version == 3 else _MP3_RATES_V2
    index = head[i + 2] >> 4
    if not 0 < index < len(rates):
        return None
    # A constant bit rate read from the first frame: a variable one is as often above as below.
    return (total_bytes - i) * 8 / (rates[index] * 1000)


def pdf_pages(pdf: bytes) -> int | None:
    """The pages of a PDF: its page objects, in the file and in its compressed object streams
    (PDF 1.5's, which hold them in most files written today); None when none is found."""
    if not pdf.startswith(b"%PDF"):
        return None
    pages = len(_PDF_PAGE.findall(pdf))
    budget = MAX_PDF_INFLATED
    view = memoryview(pdf)  # each stream is inflated from the file in place, not a copy
    for n, found in enumerate(_PDF_OBJECT_STREAM.finditer(pdf)):
        start = _PDF_STREAM.search(pdf, found.end())
        if n >= MAX_PDF_OBJECT_STREAMS or start is None or budget <= 0:
            break
        inflater = zlib.decompressobj()
        try:
            inflated = inflater.decompress(view[start.end() :], budget)
        except zlib.error:
            continue
        budget -= len(inflated)
        pages += len(_PDF_PAGE.findall(inflated))
    return pages or None
