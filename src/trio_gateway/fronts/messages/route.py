"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API in
front of every alias, on the chat front's path (``chat.serve_request``): the same routing,
admission, keys, budgets, usage records (``endpoint = "messages"``) and cancellation. The
body is translated into a chat body (``messages_request.py``), the answer's events into
Anthropic's (``messages_events.py``); no provider is known here."""

from __future__ import annotations

import json
import logging
from functools import partial

import attrs

from trio_gateway.config.schema import ServerConfig
from trio_gateway.core.anthropic_ids import anthropic_id
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.request import ChatRequest, read_chat_json, validate_chat_body
from trio_gateway.core.usage import estimate_prompt_tokens, estimate_tokens
from trio_gateway.dispatch.relay import DropConnection, Outcome
from trio_gateway.dispatch.router import Router
from trio_gateway.dispatch.routing import resolve_alias
from trio_gateway.fronts.auth import authorize, with_session
from trio_gateway.fronts.chat import (
    Accumulator,
    Answer,
    Encoder,
    dropped_tools_headers,
    for_key,
    known_alias,
    serve_request,
)
from trio_gateway.fronts.direct import ClientSocket
from trio_gateway.fronts.http import Receive, Send, read_body, send_json
from trio_gateway.fronts.messages.events import (
    MessageAccumulator,
    MessageBuilder,
    MessageEncoder,
    anthropic_error,
    anthropic_stream_error,
)
from trio_gateway.fronts.messages.request import FRONT, MESSAGES_PARTS, Translated, translate
from trio_gateway.fronts.off_loop import off_loop
from trio_gateway.ops.access import current as current_request

log = logging.getLogger("trio_gateway")


def _read(router: Router, raw: bytes, *, count_only: bool = False) -> Translated:
    """The body, translated; the alias it names goes into the request's context first, as
    ``chat.read_request`` does, so a refusal is recorded under it."""
    body = read_chat_json(raw, MESSAGES_PARTS)
    context = current_request()
    alias = known_alias(router, body)
    if context is not None:
        context.alias = alias
    alias_config = router.aliases.get(alias) if alias is not None else None
    translated = translate(
        body,
        count_only=count_only,
        builtin_tools=alias_config.builtin_tools if alias_config is not None else "drop",
        anthropic_beta=context.anthropic_beta if context is not None else None,
        without_thinking=(
            alias_config.messages_without_thinking if alias_config is not None else "model_default"
        ),
    )
    for label, name in translated.dropped:
        log.debug("messages: dropped %r (not translated for the chat shape)", name)
        router.metrics.front_dropped(FRONT, label)
    return translated


def messages_request(router: Router, raw: bytes, key: ApiKey | None) -> tuple[ChatRequest, bool]:
    """The request, and whether it enabled thinking (only then does the answer show it)."""
    translated = _read(router, raw)
    request = validate_chat_body(translated.body)
    request = attrs.evolve(request, front=FRONT, dropped_tools=translated.dropped_tools)
    return with_session(for_key(router, request, key), translated.session_id), translated.thinking


async def handle_messages(
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

    def read(raw: bytes) -> tuple[ChatRequest, bool, int]:
        request, thinking = messages_request(router, raw, key)
        # The client's x-session-id header wins over the one in metadata.user_id.
        request = with_session(request, session_id)
        router.screen(request)
        # message_start carries the input tokens before the vendor counted them: the
        # estimate, replaced by the count in message_delta.
        return request, thinking, request.prompt_estimate()

    request, thinking, estimate = await off_loop(len(raw), partial(read, raw))
    del raw
    alias = request.alias
    # Anthropic's shape (msg_01…), its own: the answer id the chat path makes from the request
    # id has a "-" and whatever a client's x-request-id holds.
    message_id = anthropic_id("msg_")

    def builder() -> MessageBuilder:
        return MessageBuilder(
            message_id=message_id, model=alias, input_tokens=estimate, thinking=thinking
        )

    def stream(answer_id: str, created: int) -> Encoder:
        return MessageEncoder(builder())

    def whole(answer_id: str, created: int) -> Accumulator:
        return MessageAccumulator(builder())

    answer = Answer(
        id_prefix="msg",
        whole=whole,
        stream=stream,
        error_shape=anthropic_error,
        stream_error=anthropic_stream_error,
        headers=dropped_tools_headers(request),
    )
    return await serve_request(
        router, server, request, answer, request_id, receive, send, drop_connection, key, client
    )


async def handle_count_tokens(
    router: Router,
    server: ServerConfig,
    request_id: str,
    receive: Receive,
    send: Send,
    drop_connection: DropConnection | None = None,
    key: ApiKey | None = None,
    client: ClientSocket | None = None,
    session_id: str | None = None,
) -> None:
    """``{"input_tokens": N}``: the gateway's own estimate of the prompt (the one budgets hold),
    not a vendor's count; nothing is sent upstream."""
    raw = await read_body(receive, server.max_body_bytes)
    tokens = await off_loop(len(raw), partial(_count_tokens, router, raw, key))
    del raw
    await send_json(send, 200, {"input_tokens": tokens}, [(b"request-id", request_id.encode())])


def _count_tokens(router: Router, raw: bytes, key: ApiKey | None) -> int:
    translated = _read(router, raw, count_only=True)
    request = authorize(validate_chat_body(translated.body), key)
    alias = resolve_alias(router.aliases, request.alias)
    types = {p.type for p in alias.providers}
    tokens = estimate_prompt_tokens(translated.body["messages"], types or (None,))
    if "tools" in translated.body:
        tools = json.dumps(translated.body["tools"], ensure_ascii=False)
        tokens += estimate_tokens(len(tools))
    return tokens
