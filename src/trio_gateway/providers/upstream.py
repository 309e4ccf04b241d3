"""The I/O shell of an ``openai_compatible`` provider: one httpx pool and one gate per provider.

Foreign exceptions (httpx, trio timeouts) become gateway errors here and nowhere else.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import attrs
import httpx
import trio

from trio_gateway.config import ProviderConfig, Secret
from trio_gateway.errors import (
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from trio_gateway.events import Event
from trio_gateway.providers.openai_compatible import ChunkParser, build_body
from trio_gateway.request import ChatRequest
from trio_gateway.sse import SSEDecodeError, SSEDecoder
from trio_gateway.upstream_errors import classify_status

Emit = Callable[[Event], Awaitable[None]]

MAX_ERROR_BODY_BYTES = 64 * 1024
AFTER_DONE_GRACE_S = 1.0
# Probes (and a slot being handed over) may briefly need connections beyond max_inflight.
POOL_HEADROOM = 2


@contextmanager
def map_httpx_errors(provider: str) -> Iterator[None]:
    try:
        yield
    except httpx.ConnectTimeout:
        raise UpstreamUnreachable(f"{provider}: connect timed out", provider=provider) from None
    except httpx.ConnectError as exc:
        raise UpstreamUnreachable(
            f"{provider}: cannot connect ({exc or 'connection refused'})", provider=provider
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


@attrs.frozen
class GateStats:
    in_flight: int
    waiting: int
    max_inflight: int


class Upstream:
    """One provider: its config, connection pool and admission gate."""

    def __init__(
        self, config: ProviderConfig, api_key: Secret | None, client: httpx.AsyncClient
    ) -> None:
        self.config = config
        self.name = config.name
        self.gate = trio.CapacityLimiter(config.max_inflight)
        self._client = client
        self._url = config.base_url.rstrip("/") + "/chat/completions"
        self._headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if api_key is not None:
            self._headers["authorization"] = f"Bearer {api_key.value}"
        self._probe_request = ChatRequest(
            alias="(probe)",
            body={"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1},
            stream=False,
            include_usage=False,
            reasoning=False,
            required=frozenset(),
        )

    @staticmethod
    def make_client(config: ProviderConfig) -> httpx.AsyncClient:
        # The pool must never be the queue: with more waiters than connections and a cancel
        # right after a request starts, httpcore 1.0.x leaks pool slots for good (httpcore
        # #1093). The gate keeps concurrency at max_inflight, below max_connections.
        limits = httpx.Limits(
            max_connections=config.max_inflight + POOL_HEADROOM,
            max_keepalive_connections=config.max_inflight,
        )
        timeout = httpx.Timeout(
            connect=config.connect_timeout_s,
            pool=config.connect_timeout_s,
            write=config.connect_timeout_s,
            read=None,  # reads are bounded per chunk, at the call site
        )
        return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)

    def statistics(self) -> GateStats:
        stats = self.gate.statistics()
        return GateStats(
            in_flight=stats.borrowed_tokens,
            waiting=stats.tasks_waiting,
            max_inflight=int(stats.total_tokens),
        )

    async def probe(self) -> None:
        """A real one-token generation with thinking off: proof that the provider generates,
        which its /health does not give. Raises a GatewayError when it does not."""

        async def ignore(event: Event) -> None:
            pass

        await self.stream_chat(self._probe_request, ignore)

    async def read_load(self) -> int | None:
        """vLLM's ``GET /load`` (``--enable-server-load-tracking``): requests it holds now,
        from every client, not only this gateway. None when the server does not offer it."""
        root = self.config.base_url.rstrip("/").removesuffix("/v1")
        try:
            with trio.fail_after(self.config.connect_timeout_s):
                response = await self._client.get(root + "/load")
            load = response.json().get("server_load") if response.status_code == 200 else None
        except (httpx.HTTPError, trio.TooSlowError, ValueError, AttributeError):
            return None
        return load if type(load) is int else None

    async def stream_chat(self, request: ChatRequest, emit: Emit) -> None:
        """Send ``request`` upstream and emit its events until the answer is complete.

        The caller holds a gate slot. Cancellation closes the upstream response at once, which
        is how vLLM learns to abort.
        """
        config = self.config
        body = json.dumps(build_body(request, config), ensure_ascii=False).encode()
        first_deadline = trio.current_time() + config.first_token_timeout_s
        with map_httpx_errors(self.name):
            upstream_request = self._client.build_request(
                "POST", self._url, content=body, headers=self._headers
            )
            try:
                with trio.fail_at(first_deadline):
                    response = await self._client.send(upstream_request, stream=True)
            except trio.TooSlowError:
                raise UpstreamTimeout(
                    f"{self.name}: no response within {config.first_token_timeout_s:g} s",
                    provider=self.name,
                ) from None
            try:
                if response.status_code != 200:
                    error_body = b""
                    with trio.move_on_after(config.idle_timeout_s):
                        error_body = await _read_limited(response, MAX_ERROR_BODY_BYTES)
                    raise classify_status(
                        self.name,
                        response.status_code,
                        error_body,
                        response.headers.get("retry-after"),
                    )
                await self._relay(response, emit, first_deadline)
            finally:
                await response.aclose()

    async def _relay(self, response: httpx.Response, emit: Emit, first_deadline: float) -> None:
        config = self.config
        decoder = SSEDecoder()
        parser = ChunkParser(self.name)
        chunks = response.aiter_bytes()
        started = False
        while True:
            try:
                if started:
                    with trio.fail_after(config.idle_timeout_s):
                        chunk = await chunks.__anext__()
                else:
                    with trio.fail_at(first_deadline):
                        chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except trio.TooSlowError:
                if started:
                    message = f"no data for {config.idle_timeout_s:g} s"
                else:
                    message = f"no first token within {config.first_token_timeout_s:g} s"
                raise UpstreamTimeout(f"{self.name}: {message}", provider=self.name) from None
            try:
                sses = decoder.feed(chunk)
            except SSEDecodeError as exc:
                raise UpstreamProtocolError(f"{self.name}: {exc}", provider=self.name) from None
            for sse in sses:
                if not sse.data:
                    continue
                for event in parser.feed(sse.data):
                    started = True
                    await emit(event)
                if parser.done:
                    break
            if parser.done:
                break
        if parser.done:
            # The answer is whole. Read to the end of the body, briefly, so the connection can
            # be reused; a server that lingers is not worth holding the client for.
            with trio.move_on_after(AFTER_DONE_GRACE_S), contextlib.suppress(httpx.HTTPError):
                async for _ in chunks:
                    pass
            return
        for sse in decoder.close():
            if sse.data:
                for event in parser.feed(sse.data):
                    await emit(event)
        for event in parser.close():
            await emit(event)


async def _read_limited(response: httpx.Response, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for part in response.aiter_bytes():
        parts.append(part)
        size += len(part)
        if size >= limit:
            break
    return b"".join(parts)[:limit]
