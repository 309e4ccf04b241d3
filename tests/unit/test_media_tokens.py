"""Media in a prompt is counted by each vendor's documented rule, never by its base64: an
image by its size (read from its header), audio by its length, a PDF by its pages; what cannot
be read counts at the vendor's maximum."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_gateway.core.media_headers import audio_seconds, image_size, pdf_pages
from trio_gateway.core.media_tokens import (
    ANTHROPIC_IMAGE_MAX,
    GEMINI_IMAGE_MAX,
    OPENAI_IMAGE_MAX,
    Media,
    describe,
    vendor_tokens,
)
from trio_gateway.core.usage import estimate_prompt_tokens


def png(width: int, height: int, padding: int = 0) -> bytes:
    ihdr = struct.pack(">II", width, height) + b"\x08\x02\x00\x00\x00"
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\0" * (4 + padding)


def jpeg(width: int, height: int, exif_bytes: int = 0) -> bytes:
    app1 = b""
    if exif_bytes:
        app1 = b"\xff\xe1" + struct.pack(">H", exif_bytes + 2) + b"E" * exif_bytes
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0" + b"\0" * 9
    sof = b"\xff\xc2" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\0" * 9
    return b"\xff\xd8" + app0 + app1 + sof + b"\xff\xda" + b"\0" * 100


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\0" * 20


def webp(chunk: bytes, payload: bytes) -> bytes:
    body = b"WEBP" + chunk + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def vp8(width: int, height: int) -> bytes:
    return webp(b"VP8 ", b"\0\0\0\x9d\x01\x2a" + struct.pack("<HH", width, height) + b"\0" * 8)


def vp8l(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    return webp(b"VP8L", b"\x2f" + struct.pack("<I", bits) + b"\0" * 8)


def vp8x(width: int, height: int) -> bytes:
    size = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return webp(b"VP8X", b"\0" * 4 + size + b"\0" * 8)


@pytest.mark.parametrize(
    "image",
    [
        png(1920, 1080),
        jpeg(1920, 1080),
        jpeg(1920, 1080, exif_bytes=60_000),  # metadata before the frame: a second read
        gif(1920, 1080),
        vp8(1920, 1080),
        vp8l(1920, 1080),
        vp8x(1920, 1080),
    ],
)
def test_an_images_size_comes_from_its_header(image: bytes) -> None:
    assert image_size(image) == (1920, 1080)
    part = data_url_part("image/any", image)
    assert describe(part) == Media(kind="image", size=(1920, 1080))


@given(st.binary(max_size=300))
def test_any_bytes_give_a_size_or_none_never_an_error(head: bytes) -> None:
    size = image_size(head)
    assert size is None or (size[0] > 0 and size[1] > 0)
    seconds = audio_seconds(head, 10_000)
    assert seconds is None or seconds >= 0
    pages = pdf_pages(b"%PDF" + head)
    assert pages is None or pages > 0


def data_url_part(mime: str, data: bytes, detail: str | None = None) -> dict[str, Any]:
    url: dict[str, Any] = {"url": f"data:{mime};base64," + base64.b64encode(data).decode()}
    if detail is not None:
        url["detail"] = detail
    return {"type": "image_url", "image_url": url}


@pytest.mark.parametrize(
    ("size", "detail", "openai", "anthropic", "gemini"),
    [
        # OpenAI's own examples: 1024 x 1024 high is 765; 2048 x 4096 is 1105; low is 85.
        ((1024, 1024), None, 765, 1399, 1032),
        ((2048, 4096), "high", 1105, 1600, GEMINI_IMAGE_MAX),
        ((4096, 8192), "low", 85, 1600, GEMINI_IMAGE_MAX),
        # Anthropic's own examples: 200 x 200 is about 54, 1092 x 1092 about 1590.
        ((200, 200), "auto", 255, 54, 258),
        ((1092, 1092), None, 765, 1590, 1032),
        # Anthropic's long edge past 1568 px is scaled down first, keeping the aspect ratio
        # (docs.claude.com/en/docs/vision, "Evaluate image size"): a long thin image counts as
        # its fit (3136 x 100 as 1568 x 50: 105, not 3136 x 100 / 750 = 419), under the cap.
        ((3136, 100), None, 765, 105, 1290),
        ((100, 4000), None, 765, 82, 1548),
        ((1568, 100), None, 765, 210, 774),
        # Gemini: 258 up to 384 px each way, then 258 a 768 px tile.
        ((384, 384), None, 255, 197, 258),
        ((385, 100), None, 255, 52, 258),
        (None, None, OPENAI_IMAGE_MAX, ANTHROPIC_IMAGE_MAX, GEMINI_IMAGE_MAX),
        (None, "low", 85, ANTHROPIC_IMAGE_MAX, GEMINI_IMAGE_MAX),
    ],
)
def test_images_count_by_each_vendors_rule(
    size: tuple[int, int] | None, detail: str | None, openai: int, anthropic: int, gemini: int
) -> None:
    image = Media(kind="image", size=size, detail=detail)
    assert vendor_tokens(image, "openai") == openai
    assert vendor_tokens(image, "anthropic") == anthropic
    assert vendor_tokens(image, "gemini") == gemini


def test_a_remote_or_undecodable_image_counts_at_the_vendors_maximum() -> None:
    remote = {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}
    broken = data_url_part("image/png", b"not an image at all")
    for part in (remote, broken):
        media = describe(part)
        assert media == Media(kind="image")
        assert vendor_tokens(media, "anthropic") == ANTHROPIC_IMAGE_MAX


def wav(seconds: float, rate: int = 16_000) -> bytes:
    byte_rate = rate * 2
    fmt = struct.pack("<HHIIHH", 1, 1, rate, byte_rate, 2, 16)
    data = b"\0" * int(seconds * byte_rate)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", len(body) + len(data)) + body + data


def mp3(seconds: float, kbps: int = 128, id3: int = 0) -> bytes:
    tag = b"ID3\x04\0\0" + bytes([(id3 >> s) & 0x7F for s in (21, 14, 7, 0)]) + b"\0" * id3
    index = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128).index(kbps)
    frame = b"\xff\xfb" + bytes([index << 4, 0x00])  # MPEG-1 layer III
    return (tag if id3 else b"") + frame + b"\0" * (int(seconds * kbps * 125) - 4)


def audio_part(data: bytes, fmt: str) -> dict[str, Any]:
    encoded = base64.b64encode(data).decode()
    return {"type": "input_audio", "input_audio": {"data": encoded, "format": fmt}}


@pytest.mark.parametrize(
    ("clip", "fmt", "seconds"),
    [
        (wav(2.0), "wav", 2.0),
        (mp3(10.0), "mp3", 10.0),
        (mp3(10.0, id3=500), "mp3", 10.0),
        # No header to read: as long as its bytes at 8 kbit/s, the least it could be.
        (b"\0" * 16_000, "mp3", 16.0),
    ],
)
def test_audio_counts_by_its_length(clip: bytes, fmt: str, seconds: float) -> None:
    media = describe(audio_part(clip, fmt))
    assert media is not None and media.seconds == pytest.approx(seconds, rel=0.01)
    assert vendor_tokens(media, "gemini") == pytest.approx(32 * seconds, rel=0.01)
    assert vendor_tokens(media, "openai") == pytest.approx(10 * seconds, rel=0.01)


def pdf(pages: int, *, compressed: bool) -> bytes:
    objects = b"".join(
        b"%d 0 obj << /Type /Page /Parent 2 0 R >> endobj\n" % i for i in range(pages)
    )
    root = b"1 0 obj << /Type /Pages /Count %d >> endobj\n" % pages
    if not compressed:
        return b"%PDF-1.4\n" + root + objects + b"%%EOF"
    packed = zlib.compress(objects)
    stream = (
        b"9 0 obj << /Type /ObjStm /N %d /First 0 /Filter /FlateDecode /Length %d >>\nstream\n"
        % (pages, len(packed))
    )
    return b"%PDF-1.5\n" + stream + packed + b"\nendstream endobj\n%%EOF"


def file_part(data: bytes, mime: str = "application/pdf", bare: bool = False) -> dict[str, Any]:
    encoded = base64.b64encode(data).decode()
    file_data = encoded if bare else f"data:{mime};base64,{encoded}"
    return {"type": "file", "file": {"file_data": file_data, "filename": "f"}}


@pytest.mark.parametrize("compressed", [False, True])
def test_a_pdf_counts_by_its_pages(compressed: bool) -> None:
    media = describe(file_part(pdf(7, compressed=compressed), bare=compressed))
    assert media == Media(kind="pdf", pages=7)
    assert vendor_tokens(media, "gemini") == 7 * 258
    assert vendor_tokens(media, "anthropic") == 7 * 3000


def test_a_file_that_cannot_be_read_counts_at_the_vendors_most_pages() -> None:
    for part in (
        {"type": "file", "file": {"file_id": "file-abc"}},
        file_part(b"%PDF-1.7 nothing that says page"),
    ):
        media = describe(part)
        assert media == Media(kind="pdf")
        assert vendor_tokens(media, "gemini") == 1000 * 258
        assert vendor_tokens(media, "openai") == 100 * 3000
    text = describe(file_part(b"x" * 4000, mime="text/plain"))
    assert text is not None and vendor_tokens(text, "gemini") == 1000


def test_a_megabyte_image_is_not_counted_as_its_base64() -> None:
    """Before, a 1 MB image counted some 340,000 tokens (its base64 / 4): a whole minute of a
    key's tpm, and a cut stream billed ~100x the vendor's price."""
    image = data_url_part("image/png", png(2000, 1500, padding=1_000_000))
    content: list[dict[str, Any]] = [{"type": "text", "text": "what is in this photo?"}, image]
    messages = [{"role": "user", "content": content}]
    text_only = estimate_prompt_tokens([{"role": "user", "content": content[:1]}])

    assert estimate_prompt_tokens(messages, ("openai",)) - text_only in range(765, 765 + 8)
    assert estimate_prompt_tokens(messages, ("anthropic",)) - text_only in range(1600, 1608)
    assert estimate_prompt_tokens(messages, ("vertex",)) - text_only in range(1548, 1556)
    # Not yet chosen: the most any of the alias's providers would count.
    assert estimate_prompt_tokens(messages, ("openai", "gemini")) - text_only in range(1548, 1556)
    assert estimate_prompt_tokens(messages) - text_only in range(1600, 1608)
    assert content[1] is image and image["image_url"]["url"].startswith("data:image/png")
