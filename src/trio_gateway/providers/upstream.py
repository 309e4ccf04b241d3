"""The vendor-neutral I/O shell of a provider: one httpx pool, one gate, one dialect.

Everything a vendor does differently is in its dialect (``providers/dialect.py``); this module
only moves bytes, and keeps the same guarantees for every vendor: deadlines for the first byte
and between chunks, the upstream response closed the moment the request's scope is cancelled
(how vLLM learns to abort), bounded buffers, and foreign exceptions mapped here and nowhere else.
Credentials are attached per request from the provider's token source, and scrubbed from any
error text an upstream sends back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import NoReturn

import attrs
import httpx
import trio

from trio_gateway.capacity.gate import GateStats, LocalGate, reservation_of
from trio_gateway.capacity.gate_kinds import Gate
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import GatewayError, UpstreamProtocolError, UpstreamTimeout
from trio_gateway.core.events import Event
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.sse import SSEDecodeError, SSEDecoder
from trio_gateway.core.usage import UsageMeter
from trio_gateway.http1.client import H1Pool, H1Response, Origin
from trio_gateway.http1.tls import trust_context
from trio_gateway.ops.access import current as current_request
from trio_gateway.ops.spans import AttemptSpan
from trio_gateway.providers.dialect import AnswerReader, Dialect, StreamParser
from trio_gateway.providers.egress import EgressTransport
from trio_gateway.providers.gemini.vertex_auth import TokenSource
from trio_gateway.providers.httpx_errors import read_limited
from trio_gateway.providers.openai_compatible.signals import (
    PrefixCacheRate,
    ReplicaSignals,
    parse_vllm_metrics,
)
from trio_gateway.providers.read_timer import ReadDeadlines, ReadTimer
from trio_gateway.providers.registry import dialect_for
from trio_gateway.providers.toolcall_stop import FirstToolCallOnly
from trio_gateway.providers.translate import REDACTED, redact_credentials

log = logging.getLogger("trio_gateway")

# The events of one upstream read (or of a whole answer), in order; never empty.
Emit = Callable[[list[Event]], Awaitable[None]]

MAX_ERROR_BODY_BYTES = 64 * 1024
# A whole (non-streamed) answer from a server that ignored "stream": bounded like everything.
MAX_WHOLE_BODY_BYTES = 16 * 1024 * 1024
AFTER_DONE_GRACE_S = 1.0
# vLLM's /metrics is some 100 KiB with its histograms; a server that sends far more is cut.
MAX_METRICS_BYTES = 4 * 1024 * 1024
# Probes (and a slot being handed over) may briefly need connections beyond max_inflight.
POOL_HEADROOM = 2
# Below the servers' own idle timeout (uvicorn under vLLM, hypercorn: 5 s, httpx's default too):
# at equal timeouts a request could be written on a connection the server was closing, and
# fail with "server disconnected" (seen in the benchmarks, docs/benchmarks.md).
KEEPALIVE_EXPIRY_S = 2.0


class Upstream:
    """One provider: its config, connection pool, admission gate, dialect and credential."""

    def __init__(
        self,
        config: ProviderConfig,
        credential: TokenSource | None,
        client: httpx.AsyncClient,
        connect: Callable[[Origin], Awaitable[trio.abc.Stream]] | None = None,
        gate: Gate | None = None,
        tls: ssl.SSLContext | None = None,
        environ: Mapping[str, str] | None = None,
        max_dials_in_flight: int | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        # max_inflight: this process's own, the host's (host_gate.py), or leases in Redis.
        self.gate: Gate = (
            gate if gate is not None else LocalGate(config.max_inflight, reservation_of(config))
        )
        # What the server says of its own load, scraped (scrape.py); read by routing and metrics.
        self.signals = ReplicaSignals()
        self.prefix_cache = PrefixCacheRate()
        self.dialect: Dialect = dialect_for(config.type)
        self._credential = credential
        # Answers ended at their first complete tool call (toolcall_stop.py); read at scrape
        # time (metrics.ToolCallStopCollector).
        self.tool_call_early_stops = 0
        # The streams' read deadlines, kept by one task (read_timer.py; started with the
        # provider's services, as serve_read_deadlines).
        self.read_deadlines = ReadDeadlines()
        # Attempts running on this upstream (pipeline._attempt): a provider retired by a reload
        # closes its connections once this is 0 (its gate may be shared with its successor).
        self.active = 0
        # Probes of /load go through httpx; the chat exchange through the lean HTTP/1.1
        # client, whose per-chunk read is a socket read and a few bytes.find (http1/client.py).
        self._client = client
        self._h1 = H1Pool(
            config.name,
            max_idle=config.max_inflight,
            idle_expiry_s=KEEPALIVE_EXPIRY_S,
            connect_timeout_s=config.connect_timeout_s,
            write_timeout_s=config.connect_timeout_s,
            connect=connect,
            # The same trust as the side requests' (make_client): one per provider.
            tls=tls if tls is not None else self.trust(config, environ),
            environ=environ,
            # This process's share of them (live.Gates.dials).
            max_dials_in_flight=max_dials_in_flight or config.max_dials_in_flight,
            dial_wait_s=config.queue_timeout_s,
        )
        self._probe_request = probe_request(config)

    @staticmethod
    def trust(config: ProviderConfig, environ: Mapping[str, str] | None = None) -> ssl.SSLContext:
        """The provider's TLS trust: its ca_file, else SSL_CERT_FILE / SSL_CERT_DIR, else
        certifi's (http1/tls.py)."""
        return trust_context(config.ca_file, os.environ if environ is None else environ)

    @staticmethod
    def make_client(
        config: ProviderConfig,
        tls: ssl.SSLContext | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> httpx.AsyncClient:
        # The pool must never be the queue: with more waiters than connections and a cancel
        # right after a request starts, httpcore 1.0.x leaks pool slots for good (httpcore
        # #1093). The gate keeps concurrency at max_inflight, below max_connections.
        limits = httpx.Limits(
            max_connections=config.max_inflight + POOL_HEADROOM,
            max_keepalive_connections=config.max_inflight,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        timeout = httpx.Timeout(
            connect=config.connect_timeout_s,
            pool=config.connect_timeout_s,
            write=config.connect_timeout_s,
            read=None,  # reads are bounded per chunk, at the call site
        )
        environ = os.environ if environ is None else environ
        transport = EgressTransport(
            tls=tls if tls is not None else Upstream.trust(config, environ),
            limits=limits,
            environ=environ,
        )
        return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)

    def statistics(self) -> GateStats:
        return self.gate.statistics()

    def resize_dials(self, max_dials_in_flight: int) -> None:
        """This process's share of the provider's new connections, and their wait, after a
        reload (``config`` is the new one already)."""
        self._h1.resize_dials(max_dials_in_flight, self.config.queue_timeout_s)

    def dial_statistics(self) -> tuple[int, int, int]:
        """New connections in flight, requests waiting to dial, and this process's bound."""
        return self._h1.dial_statistics()

    def close_idle(self) -> None:
        """Close the idle upstream connections (a provider retired by a reload)."""
        self._h1.close_idle()

    async def serve_read_deadlines(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Keep every stream's read deadlines (without it, each stream keeps its own)."""
        await self.read_deadlines.serve(task_status=task_status)

    async def expire_idle(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Close idle connections past their expiry while the gateway is quiet, too."""
        await self._h1.expire_idle(task_status=task_status)

    async def probe(self) -> None:
        """A real one-token generation (:func:`probe_request`): proof that the provider
        generates, which its /health does not give. Raises a GatewayError when it does not."""

        async def ignore(events: list[Event]) -> None:
            pass

        await self.stream_chat(self._probe_request, ignore)

    async def read_load(self) -> int | None:
        """vLLM's ``GET /load`` (``--enable-server-load-tracking``): requests it holds now,
        from every client, not only this gateway. None when the server does not offer it."""
        if self.config.type != "openai_compatible":
            return None
        root = self.config.endpoint.removesuffix("/v1")
        try:
            with trio.fail_after(self.config.connect_timeout_s):
                response = await self._client.get(root + "/load")
            load = response.json().get("server_load") if response.status_code == 200 else None
        except (httpx.HTTPError, trio.TooSlowError, ValueError, AttributeError):
            return None
        return load if type(load) is int else None

    async def read_signals(self) -> ReplicaSignals | None:
        """vLLM's ``/metrics`` (the series routing and reporting use) and ``/load``. None when
        the server offers neither; a series it lacks stays None."""
        if self.config.type != "openai_compatible":
            return None
        root = self.config.endpoint.removesuffix("/v1")
        try:
            with trio.fail_after(self.config.connect_timeout_s):
                async with self._client.stream("GET", root + "/metrics") as response:
                    text = None
                    if response.status_code == 200:
                        body = await read_limited(response, MAX_METRICS_BYTES)
                        text = body.decode(errors="replace")  # UTF-8
        except (httpx.HTTPError, trio.TooSlowError, GatewayError):
            text = None
        load = await self.read_load()
        own = self.gate.statistics().in_flight
        if text is None and load is None:
            return None
        signals = parse_vllm_metrics(text) if text is not None else ReplicaSignals()
        return attrs.evolve(signals, load=load, load_own=own)

    async def stream_chat(
        self, request: ChatRequest, emit: Emit, meter: UsageMeter | None = None
    ) -> None:
        """Send ``request`` upstream and emit its events until the answer is complete.

        The caller holds a gate slot. Cancellation closes the upstream response at once, which
        is how vLLM learns to abort. When a stream ends, however it ends (complete, cut by an
        error, cancelled), the parser's usage so far is left in ``meter``: that is how a cut
        stream is billed.
        """
        config = self.config
        call = self.dialect.build_call(request, config)
        first_deadline = trio.current_time() + config.first_token_timeout_s
        secret: str | None = None
        headers = dict(call.headers)
        try:
            if self._credential is not None:
                with trio.fail_at(first_deadline):
                    secret = await self._credential.token()
                headers.update(self.dialect.auth_headers(secret))
        except trio.TooSlowError:
            raise UpstreamTimeout(
                f"{self.name}: no credential within {config.first_token_timeout_s:g} s",
                provider=self.name,
            ) from None
        attempt: AttemptSpan | None = None
        if (context := current_request()) is not None:
            # Each attempt is a span of the request's trace: vLLM (--otlp-traces-endpoint) joins
            # its own spans to it, and takes the id into its logs (--enable-request-id-headers).
            # With tracing on, that span is the gateway's own, exported (ops/spans.py).
            if context.span is None:
                headers.update(context.trace.child().headers())
            else:
                attempt = context.span.attempt(
                    self.name, config.type, config.model, config.endpoint
                )
                headers.update(attempt.trace.headers())
            headers["x-request-id"] = context.request_id
        # The exchange here, not in a coroutine of its own: each of thousands of streams holds
        # every frame of its chain while it runs.
        try:
            # A plain scope, not fail_at's generator: it is held through the wait for the head,
            # which is where thousands of requests are while a load ramps up.
            # From the moment the request goes out, a client's hang-up ends the exchange at
            # once (chat.HangUpCancel): waiting for the head (vLLM queueing it, or generating a
            # whole answer) as much as reading the answer.
            sending = None if context is None else partial(setattr, context, "abort_upstream")
            try:
                with trio.CancelScope(deadline=first_deadline) as waiting:
                    response = await self._h1.post(call.url, headers, call.body, sending)
            finally:
                if context is not None:
                    context.abort_upstream = None
            if waiting.cancelled_caught:
                raise UpstreamTimeout(
                    f"{self.name}: no response within {config.first_token_timeout_s:g} s",
                    provider=self.name,
                )
            if attempt is not None:
                attempt.headers(response.status_code)
            first_tool_call_only = call.first_tool_call_only
            # A completion's or an embeddings' answer is read by its own reader.
            reader: AnswerReader = call.reader or self.dialect
            max_whole_bytes = call.max_whole_bytes or MAX_WHOLE_BODY_BYTES
            del headers, call  # sent: not held through the answer (its body is the prompt)
            if context is not None:
                context.abort_upstream = response.abort
            try:
                if response.status_code != 200:
                    error_body = b""
                    with trio.move_on_after(config.idle_timeout_s):
                        error_body = await response.read_limited(MAX_ERROR_BODY_BYTES)
                    raise reader.classify_error(
                        self.name, response.status_code, error_body, response.headers
                    )
                content_type = response.head.get("content-type") or ""
                if content_type.startswith("application/json"):
                    await self._whole(response, emit, first_deadline, reader, max_whole_bytes)
                else:
                    await self._relay(
                        response, emit, first_deadline, meter, first_tool_call_only, reader
                    )
            finally:
                if context is not None:
                    context.abort_upstream = None
                await response.aclose()
        except GatewayError as exc:
            # Vendors echo parts of a refused key back ("Incorrect API key provided: sk-...").
            exc.message = _scrub(exc.message, secret)
            exc.args = (exc.message,)
            if attempt is not None:
                attempt.end(exc)
            raise
        except BaseException as exc:
            if attempt is not None:
                attempt.end(exc)  # cancelled (the client left, a deadline), or a bug
            raise
        else:
            if attempt is not None:
                attempt.end(None)

    async def _whole(
        self,
        response: H1Response,
        emit: Emit,
        first_deadline: float,
        reader: AnswerReader,
        max_bytes: int = MAX_WHOLE_BODY_BYTES,
    ) -> None:
        """One JSON body: an embeddings answer, or a server that answered a stream request
        without streaming."""
        try:
            with trio.fail_at(first_deadline):
                # One byte past the bound shows a body over it.
                body = await response.read_limited(max_bytes + 1)
        except trio.TooSlowError:
            raise UpstreamTimeout(
                f"{self.name}: no whole answer within {self.config.first_token_timeout_s:g} s",
                provider=self.name,
            ) from None
        if len(body) > max_bytes:
            raise UpstreamProtocolError(
                f"{self.name}: a whole answer larger than {max_bytes} bytes",
                provider=self.name,
            )
        events = reader.parse_whole(self.name, body)
        if events:
            await emit(events)

    async def _relay(
        self,
        response: H1Response,
        emit: Emit,
        first_deadline: float,
        meter: UsageMeter | None,
        first_tool_call_only: bool,
        reader: AnswerReader,
    ) -> None:
        # One coroutine from here to the reads, not two: each of thousands of streams holds
        # every frame of its chain for as long as it runs.
        config = self.config
        parser: StreamParser = reader.new_parser(self.name)
        if first_tool_call_only:
            parser = FirstToolCallOnly(parser)
        decoder = SSEDecoder()
        timer = ReadTimer(first_deadline=first_deadline, idle_s=config.idle_timeout_s)
        try:
            if self.read_deadlines.running:
                with timer.scope, self.read_deadlines.keeping(timer):
                    await self._read_events(response, decoder, parser, emit, timer)
            else:
                await self._read_watched(response, decoder, parser, emit, timer)
            if timer.expired is not None:
                if timer.expired == "idle":
                    message = f"no data for {config.idle_timeout_s:g} s"
                else:
                    message = f"no first token within {config.first_token_timeout_s:g} s"
                raise UpstreamTimeout(f"{self.name}: {message}", provider=self.name)
            if isinstance(parser, FirstToolCallOnly) and parser.stopped:
                await self._end_at_first_tool_call(response, emit, parser)
                return
            if parser.done:
                if response.ended:
                    return  # the usual end: [DONE] and the body's last chunk came in one read
                # The answer is whole. Read to the end of the body, briefly, so the connection
                # can be reused; a server that lingers is not worth holding the client for.
                with trio.move_on_after(AFTER_DONE_GRACE_S), contextlib.suppress(GatewayError):
                    while await response.receive():
                        pass
                return
            try:
                rest = decoder.close()
            except SSEDecodeError as exc:
                raise UpstreamProtocolError(f"{self.name}: {exc}", provider=self.name) from None
            events = []
            try:
                for sse in rest:
                    if sse.data:
                        events += parser.feed(sse)
                events += parser.close()
            finally:
                if events:
                    await emit(events)
        finally:
            # Once per stream, on every way out (Cancelled included): no await, no per-chunk cost.
            if meter is not None and (partial := parser.usage_so_far()) is not None:
                meter.partial = partial

    async def _read_watched(
        self,
        response: H1Response,
        decoder: SSEDecoder,
        parser: StreamParser,
        emit: Emit,
        timer: ReadTimer,
    ) -> None:
        """The reads with a watcher of their own: an upstream used without its services (a
        test, a tool) still keeps its deadlines."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(timer.watch)
                with timer.scope:
                    await self._read_events(response, decoder, parser, emit, timer)
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The watcher raises nothing of its own: a lone error is the reads', and callers
            # (failover, the error answer) expect it as it is, not wrapped.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    async def _end_at_first_tool_call(
        self, response: H1Response, emit: Emit, parser: FirstToolCallOnly
    ) -> None:
        # Closed before the ending goes out, so a slow client cannot keep the GPU busy with
        # calls nobody will see: the closed connection is what makes vLLM abort them.
        await response.aclose()
        self.tool_call_early_stops += 1
        log.debug("%s: answer ended at its first tool call (parallel_tool_calls: false)", self.name)
        events = parser.close()
        if events:
            await emit(events)

    async def _read_events(
        self,
        response: H1Response,
        decoder: SSEDecoder,
        parser: StreamParser,
        emit: Emit,
        timer: ReadTimer,
    ) -> None:
        """Reads, decodes and emits until the body or the answer ends: the per-chunk path."""
        while True:
            timer.reading()
            parts = await response.receive()
            timer.read_done()
            if not parts:
                if response.ended:
                    return
                continue
            # One batch per read: a stream that is behind writes many chunks at once.
            events: list[Event] = []
            try:
                self._parse_read(parts, decoder, parser, events)
            finally:
                del parts  # none of a read is held through the wait for the next one
                # What came before an in-band error in the same read is the client's too.
                if events:
                    timer.started = True
                    await emit(events)
            del events
            if parser.done:
                return

    def _parse_read(
        self, parts: list[bytes], decoder: SSEDecoder, parser: StreamParser, events: list[Event]
    ) -> None:
        """One read's bytes, decoded and parsed into ``events`` (those before an error that
        stops it part-way included). Its own frame: the read's bytes, events and decoded text
        go with it, not waiting with each of thousands of streams for its next read."""
        try:
            # One piece (the usual read) is joined without a copy: CPython returns it as is.
            sses = decoder.feed(b"".join(parts))
        except SSEDecodeError as exc:
            raise UpstreamProtocolError(f"{self.name}: {exc}", provider=self.name) from None
        for sse in sses:
            if sse.data:
                events += parser.feed(sse)
                if parser.done:
                    return


def probe_request(config: ProviderConfig) -> ChatRequest:
    """The readiness probe's request, of the kind ``probe_endpoint`` names: one that every model
    of every vendor takes. For chat, one short user turn and ``max_tokens: 1`` (Anthropic
    requires a limit; every vendor takes 1), and nothing else: no reasoning switch (o3 cannot
    stop reasoning, gemini-2.5-pro refuses a budget of 0, and each would refuse every probe),
    no sampling fields (reasoning models refuse them). The provider's configured model and
    dialect translate it as any request."""
    kind = RequestKind(config.probe_endpoint)
    body: dict[str, object] = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    if kind is RequestKind.COMPLETIONS:
        body = {"prompt": "ping", "max_tokens": 1}
    elif kind is RequestKind.EMBEDDINGS:
        body = {"input": "ping"}
    return ChatRequest(
        alias="(probe)",
        body=body,
        stream=False,
        include_usage=False,
        reasoning=None,
        required=frozenset(),
        kind=kind,
    )


def _scrub(message: str, secret: str | None) -> str:
    if secret:
        message = message.replace(secret, REDACTED)
    return redact_credentials(message)
