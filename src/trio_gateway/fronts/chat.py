"""``POST /v1/chat/completions``: the OpenAI-compatible front."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from trio_gateway.config.schema import ServerConfig
from trio_gateway.core.body import CHAT_PARTS, PartPaths
from trio_gateway.core.errors import ContentFiltered, GatewayError, InternalError
from trio_gateway.core.events import Event
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.request import (
    ChatRequest,
    read_chat_json,
    requested_alias,
    validate_chat_body,
)
from trio_gateway.core.sse import DONE
from trio_gateway.core.validation import within_depth
from trio_gateway.dispatch.relay import CLIENT_GONE, DropConnection, Item, Outcome, Watch, relay
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.auth import authorize, prioritize, with_session
from trio_gateway.fronts.direct import ClientSocket
from trio_gateway.fronts.http import (
    ErrorShape,
    Receive,
    Send,
    SSEAnswer,
    openai_error,
    read_body,
    send_error,
    send_json,
)
from trio_gateway.fronts.off_loop import off_loop
from trio_gateway.fronts.openai_chunks import ChunkEncoder, ResponseAccumulator, error_chunk
from trio_gateway.ops.access import RequestContext
from trio_gateway.ops.access import current as current_request

if TYPE_CHECKING:
    from trio_gateway.http1.hang_ups import HangUps


class HangUpCancel:
    """:func:`watch_disconnect`'s work without a task of the request's own, where the server
    keeps a hang-up watch (``http1.hang_ups``): called once the client hangs up, it cancels the
    request's scope and shuts the upstream connection at once (``RequestContext.abort_upstream``):
    the cancelled producer runs only on trio's next turn, which at thousands of streams may be
    a burst of other streams' chunks away. A hang-up after the answer is no cancellation."""

    __slots__ = ("_answered", "_context", "_fd", "_hang_ups", "_outcome", "_scope")

    def __init__(self, hang_ups: HangUps, fd: int, answered: trio.Event) -> None:
        self._hang_ups = hang_ups
        self._fd = fd
        self._answered = answered
        self._scope: trio.CancelScope | None = None
        self._outcome: Outcome | None = None
        self._context: RequestContext | None = None

    def start(self, scope: trio.CancelScope, outcome: Outcome) -> None:
        self._scope, self._outcome, self._context = scope, outcome, current_request()
        self._hang_ups.watch(self._fd, self)

    def stop(self) -> None:
        self._hang_ups.unwatch(self._fd, self)

    def __call__(self) -> None:
        scope, outcome = self._scope, self._outcome
        if scope is None or outcome is None or self._answered.is_set():
            return
        outcome.cancelled = outcome.cancelled or CLIENT_GONE
        scope.cancel(reason=CLIENT_GONE)
        context = self._context
        if context is not None and context.abort_upstream is not None:
            context.abort_upstream()


def client_watch(
    receive: Receive, client: ClientSocket | None, answered: trio.Event
) -> tuple[list[Watch], HangUpCancel | None]:
    """How a request learns that its client left: from the server's hang-up watch where it
    runs, else from a watcher task waiting on ``receive()``."""
    if client is not None and client.hang_ups is not None:
        return [], HangUpCancel(client.hang_ups, client.sock.fileno(), answered)

    async def watch(scope: trio.CancelScope, outcome: Outcome) -> None:
        await watch_disconnect(receive, scope, outcome, answered)

    return [watch], None


async def watch_disconnect(
    receive: Receive, scope: trio.CancelScope, outcome: Outcome, answered: trio.Event
) -> None:
    """hypercorn never cancels the app when a client leaves (and ``send`` keeps succeeding), so
    the only sign is ``http.disconnect`` from ``receive``. hypercorn also reports it once the
    last byte of an answer is out: ``answered`` tells the two apart."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not answered.is_set():
                outcome.cancelled = outcome.cancelled or CLIENT_GONE
                scope.cancel(reason=CLIENT_GONE)
            return


def known_alias(router: Router, body: object) -> str | None:
    """The alias a decoded body names, if the config has it. A name the config does not know
    is a client's text: it never becomes an alias in the usage record or the access line."""
    alias = requested_alias(body)
    return alias if alias is not None and alias in router.aliases else None


def read_chat_request(router: Router, raw: bytes, key: ApiKey | None) -> ChatRequest:
    """The body as a request the key may make. The alias it names goes into the request's
    context as soon as the body is JSON: a refusal after that (validation, the key, routing,
    limits) is recorded under it (docs/accounting.md, "The record")."""
    return read_request(
        router,
        raw,
        key,
        lambda body, raw: validate_chat_body(body, depth_known=within_depth(raw)),
        CHAT_PARTS,
    )


def read_request(
    router: Router,
    raw: bytes,
    key: ApiKey | None,
    validate: Callable[[object, bytes], ChatRequest],
    parts: PartPaths = (),
) -> ChatRequest:
    """:func:`read_chat_request` for any endpoint, with its own validation of the decoded body
    (and its own ``parts``, the arrays whose items core/body.py bounds)."""
    body = read_chat_json(raw, parts)
    context = current_request()
    if context is not None:
        context.alias = known_alias(router, body)
    return for_key(router, validate(body, raw), key)


async def read_screened(
    router: Router, raw: bytes, read: Callable[[bytes], ChatRequest]
) -> ChatRequest:
    """A front's reading of ``raw`` into a request (``read(raw)``) and its alias's input
    filters (``Router.screen``): in a worker thread when the body is big (``off_loop``)."""

    def read_and_screen() -> ChatRequest:
        request = read(raw)
        router.screen(request)
        return request

    return await off_loop(len(raw), read_and_screen)


def for_key(router: Router, request: ChatRequest, key: ApiKey | None) -> ChatRequest:
    """A validated request as its key may make it (``authorize``), at its priority class: the
    key's or alias's, or the lower one its ``x-priority`` asks for (``prioritize``). Every front
    goes through here once its body is a chat request."""
    context = current_request()
    header = context.priority_header if context is not None else None
    return prioritize(authorize(request, key), key, router.aliases, header)


class Accumulator(Protocol):
    """Events → one JSON answer (``openai_chunks.ResponseAccumulator`` and its kin)."""

    @property
    def finish_reason(self) -> str | None:
        """Set once the answer is whole."""
        ...

    def add(self, event: Event) -> None: ...

    def result(self) -> dict[str, Any]: ...


class Encoder(Protocol):
    """Events → the SSE bytes of a streamed answer (``openai_chunks.ChunkEncoder`` and kin)."""

    def encode(self, event: Event) -> bytes: ...


class WholeAnswer:
    """A non-streamed answer, as the relay's sink: the events gathered, one JSON body at the end
    (or the error that came instead)."""

    def __init__(
        self,
        send: Send,
        accumulator: Accumulator,
        headers: list[tuple[bytes, bytes]],
        error_shape: ErrorShape = openai_error,
    ) -> None:
        self._send = send
        self._accumulator = accumulator
        self._headers = headers
        self._error_shape = error_shape
        self._error: GatewayError | None = None
        self.answered = trio.Event()

    async def put(self, items: Sequence[Item]) -> None:
        for item in items:
            if isinstance(item, GatewayError):
                self._error = item
            elif self._error is None:
                self._accumulator.add(item)

    async def end(self) -> None:
        self.answered.set()
        if self._error is not None:
            await send_error(self._send, self._error, self._headers, self._error_shape)
        elif self._accumulator.finish_reason is None:
            # The producer ended without an answer or an error: only cancellation does that.
            early = InternalError("the answer ended early")
            await send_error(self._send, early, self._headers, self._error_shape)
        else:
            await send_json(self._send, 200, self._accumulator.result(), self._headers)


async def handle_chat(
    router: Router,
    server: ServerConfig,
    request_id: str,
    receive: Receive,
    send: Send,
    drop_connection: DropConnection | None = None,
    key: ApiKey | None = None,
    client: ClientSocket | None = None,
    session_id: str | None = None,
) -> Outcome:
    # The raw bytes are not kept in this frame: it lasts as long as the answer streams.
    raw = await read_body(receive, server.max_body_bytes)
    request = await read_screened(
        router, raw, lambda raw: with_session(read_chat_request(router, raw, key), session_id)
    )
    del raw

    encoders: list[ChunkEncoder] = []

    def stream(completion_id: str, created: int) -> Encoder:
        encoder = ChunkEncoder(
            completion_id=completion_id,
            created=created,
            model=request.alias,
            include_usage=request.include_usage,
        )
        encoders.append(encoder)
        return encoder

    def stream_error(error: GatewayError) -> bytes:
        if isinstance(error, ContentFiltered) and encoders:
            # A block output filter: the choice ends as OpenAI ends a filtered one, and the
            # error in band says which filter (the SDK raises it after the finish chunk).
            return encoders[0].finish_chunk("content_filter") + openai_stream_error(error)
        return openai_stream_error(error)

    def whole(completion_id: str, created: int) -> Accumulator:
        return ResponseAccumulator(
            completion_id=completion_id, created=created, model=request.alias
        )

    answer = Answer(id_prefix="chatcmpl", whole=whole, stream=stream, stream_error=stream_error)
    return await serve_request(
        router, server, request, answer, request_id, receive, send, drop_connection, key, client
    )


def openai_stream_error(error: GatewayError) -> bytes:
    """An error once a stream has begun, as the OpenAI fronts write it: an in-band chunk, then
    the stream's end."""
    return error_chunk(error) + DONE


@attrs.frozen
class Answer:
    """How a front writes its answers: the id's prefix, a streamed answer's encoder, a whole
    answer's accumulator (each made from the answer's id and creation time), and how it words
    an error: before anything was sent (``error_shape``), and in band (``stream_error``)."""

    id_prefix: str
    whole: Callable[[str, int], Accumulator]
    stream: Callable[[str, int], Encoder] | None = None  # None: the endpoint never streams
    error_shape: ErrorShape = openai_error
    stream_error: Callable[[GatewayError], bytes] = openai_stream_error
    # Written after the last event of a stream (the events front's end marker, say).
    closing: Callable[[], bytes] = lambda: b""
    # Headers of its own on every answer (the agent fronts' x-gateway-dropped-tools).
    headers: Sequence[tuple[bytes, bytes]] = ()
    # The id the client sees, where the front makes its own (the Responses front's resp_...);
    # else the answer's id (id_prefix-request id). Its span's gen_ai.response.id.
    client_id: str | None = None


def dropped_tools_headers(request: ChatRequest) -> list[tuple[bytes, bytes]]:
    """The agent fronts' ``x-gateway-dropped-tools``: the built-in tools dropped from the
    request, by type (each a type the front knows, or "other"), when there are any."""
    if not request.dropped_tools:
        return []
    return [(b"x-gateway-dropped-tools", ", ".join(request.dropped_tools).encode())]


async def serve_request(
    router: Router,
    server: ServerConfig,
    request: ChatRequest,
    answer: Answer,
    request_id: str,
    receive: Receive,
    send: Send,
    drop_connection: DropConnection | None,
    key: ApiKey | None,
    client: ClientSocket | None,
) -> Outcome:
    """A validated request of any kind (chat, completions, embeddings), routed, admitted and
    relayed: one path for all, so each has the same gates, budgets, records and cancellation."""
    plan = router.plan(request)
    admission = await router.admit(key, request, plan)
    completion_id = f"{answer.id_prefix}-{request_id}"
    created = int(time.time())
    extra_headers = [(b"x-request-id", request_id.encode())]
    if admission is not None:
        extra_headers += admission.headers
    extra_headers += answer.headers

    sink: SSEAnswer | WholeAnswer
    if request.stream and answer.stream is not None:
        encoder = answer.stream(completion_id, created)
        stream_error = answer.stream_error

        def render(item: Item) -> bytes:
            if isinstance(item, GatewayError):
                return stream_error(item)
            return encoder.encode(item)

        answered = trio.Event()
        sink = SSEAnswer(
            send,
            render=render,
            headers=extra_headers,
            answered=answered,
            stall_timeout_s=server.client_stall_timeout_s,
            client=client,
            drop=drop_connection,
            closing=answer.closing,
            error_shape=answer.error_shape,
        )
    else:
        accumulator = answer.whole(completion_id, created)
        sink = WholeAnswer(send, accumulator, extra_headers, answer.error_shape)
        answered = sink.answered

    watchers, hang_up = client_watch(receive, client, answered)
    if isinstance(sink, SSEAnswer) and client is None:
        watchers.append(sink.watchdog)  # hypercorn's writes: no deadline of their own
    return await relay(
        request,
        plan,
        sink=sink,
        client_stall_timeout_s=server.client_stall_timeout_s,
        watch=watchers,
        hang_up=hang_up,
        drop_connection=drop_connection,
        request_id=request_id,
        admission=admission,
        response_id=answer.client_id or completion_id,
    )
