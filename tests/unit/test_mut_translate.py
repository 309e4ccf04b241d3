"""The shared translation helpers (``providers/translate.py``) by table.

Written for mutation testing (docs/testing.md): the dialect tests reach these through whole
requests with a few typical values; these pin each branch.
"""

from __future__ import annotations

import re

import pytest

from trio_gateway.core.errors import InvalidRequest
from trio_gateway.providers.translate import (
    InlineData,
    budget_for,
    content_texts,
    image_type_from_url,
    new_tool_call_id,
    parse_data_url,
    tool_arguments_object,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://h/a.png", "image/png"),
        ("https://h/a.PNG", "image/png"),
        ("https://h/a.jpg", "image/jpeg"),
        ("https://h/a.jpeg", "image/jpeg"),
        ("https://h/a.webp", "image/webp"),
        ("https://h/a.gif", "image/gif"),
        ("https://h/a.heic", "image/heic"),
        ("https://h/a.heif", "image/heif"),
        ("https://h/a.tar.png?x=1.jpg#y.gif", "image/png"),
        ("https://h/a.png#frag.gif", "image/png"),
        ("https://h/a.png?q=b.gif#c.webp", "image/png"),
        ("https://h/d.gif/a", None),
        ("https://h.png/a", None),
        ("https://h/a.svg", None),
        ("https://h/png", None),
        ("https://h/a.", None),
        ("a.png", "image/png"),
        ("https://h/a.png?x=1?y=2", "image/png"),
        ("https://h/a.png#x#y", "image/png"),
    ],
)
def test_image_type_from_url(url: str, expected: str | None) -> None:
    assert image_type_from_url(url) == expected


@pytest.mark.parametrize(
    ("effort", "budget"),
    [
        ("minimal", 1024),
        ("low", 2048),
        ("medium", 8192),
        ("high", 16384),
        ("xhigh", 32768),
        (None, 8192),
        ("", 8192),
        ("unknown", 8192),
    ],
)
def test_budget_for(effort: str | None, budget: int) -> None:
    assert budget_for(effort) == budget


@pytest.mark.parametrize(
    ("content", "texts"),
    [
        ("hi", ["hi"]),
        ("", []),
        (None, []),
        (5, []),
        (
            [
                {"type": "text", "text": "a"},
                {"type": "text", "text": ""},
                {"type": "image_url", "text": "no"},
                {"type": "text", "text": 3},
                {"text": "untyped"},
                "text",
                {"type": "text", "text": "b"},
            ],
            ["a", "b"],
        ),
    ],
)
def test_content_texts(content: object, texts: list[str]) -> None:
    assert content_texts(content) == texts


def test_new_tool_call_ids_are_call_and_24_hex_digits_and_unique() -> None:
    ids = {new_tool_call_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png,abc", "expected a base64 data URL (data:<type>;base64,...)"),
        ("data:image/png;base64,a!b=", "the data URL's payload is not valid base64"),
    ],
)
def test_bad_data_urls(url: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_data_url(url, param="p.url")
    assert (caught.value.message, caught.value.param) == (message, "p.url")


def test_a_data_url() -> None:
    assert parse_data_url("data:image/png;base64,aGk=", param="p") == InlineData(
        "image/png", "aGk="
    )
    assert parse_data_url("https://h/a.png", param="p") is None


@pytest.mark.parametrize("arguments", ["[1]", "3", '"x"'])
def test_tool_arguments_that_are_not_an_object(arguments: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        tool_arguments_object(arguments, param="p.arguments")
    assert caught.value.message == "tool call arguments must be a JSON object"
    assert caught.value.param == "p.arguments"
