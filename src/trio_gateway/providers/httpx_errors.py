"""httpx's exceptions → the gateway's, at the one boundary where upstream I/O happens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from trio_gateway.core.errors import UpstreamProtocolError, UpstreamTimeout, UpstreamUnreachable


def describe(exc: BaseException) -> str:
    """The deepest message of ``exc``'s chain: httpx says nothing (``ConnectError('')``) of a
    certificate it refused, and the ``ssl`` error under it says which and why."""
    found = str(exc)
    seen = 0
    cause = exc.__cause__ or exc.__context__
    while cause is not None and seen < 8:  # bounded: a chain is short, but never trusted
        found = str(cause) or found
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return found


@contextmanager
def map_httpx_errors(provider: str) -> Iterator[None]:
    try:
        yield
    except httpx.ConnectTimeout:
        raise UpstreamUnreachable(f"{provider}: connect timed out", provider=provider) from None
    except httpx.ConnectError as exc:
        raise UpstreamUnreachable(
            f"{provider}: cannot connect ({describe(exc) or 'connection refused'})",
            provider=provider,
        ) from None
    except httpx.PoolTimeout:
        raise UpstreamUnreachable(
            f"{provider}: no connection free in the pool", provider=provider
        ) from None
    except httpx.TimeoutException as exc:
        raise UpstreamTimeout(f"{provider}: {exc or 'timed out'}", provider=provider) from None
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        raise UpstreamProtocolError(
            f"{provider}: connection lost ({exc or exc.__class__.__name__})", provider=provider
        ) from None
    except httpx.HTTPError as exc:
        raise UpstreamProtocolError(f"{provider}: {exc!r}", provider=provider) from None


async def read_limited(response: httpx.Response, limit: int) -> bytes:
    """At most ``limit`` bytes of a body: error bodies and token answers are small, and a
    server that sends more is not worth the memory."""
    parts: list[bytes] = []
    size = 0
    async for part in response.aiter_bytes():
        parts.append(part)
        size += len(part)
        if size >= limit:
            break
    return b"".join(parts)[:limit]
