"""``providers/httpx_errors.read_limited``: how much of a body it reads and keeps.

Written for mutation testing (docs/testing.md): error bodies and token answers are read with it,
and a server that sends more than the bound must not be read further.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from trio_gateway.providers.httpx_errors import read_limited


class Chunks:
    """A body of the given chunks that counts how many were read."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks
        self.read = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.read += 1
            yield chunk


async def limited(body: Chunks, limit: int) -> bytes:
    return await read_limited(httpx.Response(200, content=body), limit)


async def test_chunks_are_joined_and_cut_at_the_limit() -> None:
    body = Chunks(b"a" * 9, b"b" * 9, b"c" * 9)
    assert await limited(body, 10) == b"a" * 9 + b"b"
    assert body.read == 2


async def test_reading_stops_as_soon_as_the_limit_is_reached() -> None:
    body = Chunks(*[b"xxxxx"] * 1000)
    assert await limited(body, 10) == b"x" * 10
    assert body.read == 2


async def test_a_body_under_the_limit_is_read_whole() -> None:
    body = Chunks(b"ab", b"cd")
    assert await limited(body, 10) == b"abcd"
    assert body.read == 2
