"""``POST /v1/completions`` and ``POST /v1/embeddings``: the OpenAI endpoints besides chat, on
the chat front's path (``chat.serve_request``): the same aliases, keys, budgets, gates, usage
records and cancellation. Only ``openai_compatible`` and ``openai`` providers serve them."""

from __future__ import annotations

from trio_gateway.config.schema import ServerConfig
from trio_gateway.core.endpoints import completions_request, embeddings_request
from trio_gateway.core.keys import ApiKey
from trio_gateway.dispatch.relay import DropConnection, Outcome
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.auth import with_session
from trio_gateway.fronts.chat import (
    Accumulator,
    Answer,
    Encoder,
    read_request,
    read_screened,
    serve_request,
)
from trio_gateway.fronts.completion_chunks import (
    CompletionAccumulator,
    CompletionChunkEncoder,
    EmbeddingsAccumulator,
)
from trio_gateway.fronts.direct import ClientSocket
from trio_gateway.fronts.http import Receive, Send, read_body


async def handle_completions(
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
    raw = await read_body(receive, server.max_body_bytes)
    request = await read_screened(
        router,
        raw,
        lambda raw: with_session(read_request(router, raw, key, completions_request), session_id),
    )
    del raw
    alias = request.alias

    def stream(completion_id: str, created: int) -> Encoder:
        return CompletionChunkEncoder(
            completion_id=completion_id,
            created=created,
            model=alias,
            include_usage=request.include_usage,
        )

    def whole(completion_id: str, created: int) -> Accumulator:
        return CompletionAccumulator(completion_id=completion_id, created=created, model=alias)

    answer = Answer(id_prefix="cmpl", whole=whole, stream=stream)
    return await serve_request(
        router, server, request, answer, request_id, receive, send, drop_connection, key, client
    )


async def handle_embeddings(
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
    raw = await read_body(receive, server.max_body_bytes)
    request = await read_screened(
        router,
        raw,
        lambda raw: with_session(read_request(router, raw, key, embeddings_request), session_id),
    )
    del raw
    alias = request.alias

    def whole(completion_id: str, created: int) -> Accumulator:
        return EmbeddingsAccumulator(model=alias)

    answer = Answer(id_prefix="embd", whole=whole)
    return await serve_request(
        router, server, request, answer, request_id, receive, send, drop_connection, key, client
    )
