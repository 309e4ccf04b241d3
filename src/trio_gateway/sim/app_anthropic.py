"""The `anthropic` dialect's handler: `POST /v1/messages`, stream or not."""

from __future__ import annotations

import hmac

import attrs
import trio

from trio_gateway.core.anthropic_ids import anthropic_id

from .anthropic_wire import (
    AnthropicContext,
    AnthropicStream,
    anthropic_error,
    anthropic_fault,
    message_body,
    parse_messages_request,
)
from .errors import ApiError
from .script import Fault, ScriptError, plan_generation
from .shell import Receive, Scope, Send, Shell, header, read_body
from .wire import dumps

__all__ = ["AnthropicHandler"]

_SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


def _with_request_id(error: ApiError, request_id: str) -> ApiError:
    body = error.body
    if isinstance(body, dict) and body.get("type") == "error":
        body = {**body, "request_id": request_id}
    return attrs.evolve(error, body=body, headers=(*error.headers, ("request-id", request_id)))


class AnthropicHandler:
    def __init__(self, shell: Shell) -> None:
        self._shell = shell
        # Thinking always arrives as thinking blocks here, whatever vLLM's parser flag says.
        self._config = attrs.evolve(shell.config, reasoning_parser=True)

    def _authorized(self, scope: Scope) -> bool:
        key = self._config.api_key
        if key is None:
            return True
        # The API's own header is x-api-key; the 2.x SDK sends `Authorization: Bearer`.
        given = header(scope, b"x-api-key")
        if given is not None:
            return hmac.compare_digest(given, key.encode())
        bearer = header(scope, b"authorization")
        return bearer is not None and hmac.compare_digest(bearer, f"Bearer {key}".encode())

    async def _refuse(self, send: Send, error: ApiError, request_id: str) -> None:
        await self._shell.refuse(send, _with_request_id(error, request_id))

    async def messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        shell = self._shell
        request_id = anthropic_id("req_")
        body = await read_body(receive)
        if body is None:
            return
        if not self._authorized(scope):
            error = anthropic_error(401, "authentication_error", "invalid x-api-key")
            await self._refuse(send, error, request_id)
            return
        shell.record(scope, body)
        parsed = parse_messages_request(
            body, self._config, version=header(scope, b"anthropic-version")
        )
        if isinstance(parsed, ApiError):
            await self._refuse(send, parsed, request_id)
            return
        request = parsed.chat
        try:
            generation = plan_generation(request, self._config)
        except ScriptError as problem:
            error = anthropic_error(400, "invalid_request_error", f"sim script: {problem}")
            await self._refuse(send, error, request_id)
            return
        fault = generation.fault
        if fault is not None and shell.engine.fault_applies(generation.script_key, fault.times):
            await trio.sleep(generation.fault_delay_s)
            await self._refuse(send, anthropic_fault(fault), request_id)
            return
        ctx = AnthropicContext(
            message_id=anthropic_id("msg_"),
            model=parsed.model,
            prompt_tokens=request.prompt.tokens,
            tool_ids=tuple(anthropic_id("toolu_") for _ in range(generation.tool_calls)),
            thinking=request.thinking,
        )
        with shell.sequence(request, generation) as seq:
            if request.stream:
                headers = [*_SSE, (b"request-id", request_id.encode())]
                renderer = AnthropicStream(ctx, generation)
                await shell.stream(scope, receive, send, seq, generation, renderer, headers)
                return
            produced = await shell.generate(scope, receive, seq, generation)
            if produced is None:
                return
            answer = dumps(message_body(ctx, generation, produced, seq.cached_tokens))

            def fault_error(fault: Fault) -> ApiError:
                return _with_request_id(anthropic_fault(fault), request_id)

            await shell.answer(send, generation, produced, answer, fault_error)
