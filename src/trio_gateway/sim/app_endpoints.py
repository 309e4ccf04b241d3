"""``POST /v1/completions`` and ``POST /v1/embeddings`` for the vllm and openai dialects: the
I/O around the pure ``endpoints.py``, through the same shell as a chat answer (the engine runs
a completion's sequences, a client that leaves aborts them)."""

from __future__ import annotations

import secrets
import time
from contextlib import ExitStack
from typing import Any

import trio

from . import errors, openai_wire
from .config import SimConfig
from .endpoints import (
    CompletionRenderer,
    completion_whole,
    embeddings_body,
    parse_completions,
    parse_embeddings,
    usage_chunk,
)
from .errors import ApiError
from .request import decode_body
from .script import Fault, Generation, ScriptError, plan_generation
from .shell import Receive, Renderer, Scope, Send, Shell, read_body, send_json
from .wire import SSE_DONE, ResponseContext, dumps, vllm_fault_body

__all__ = ["EndpointsHandler"]

_SSE = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
# The request fields OpenAI documents for each; it refuses any other ("Unrecognized ...").
_OPENAI_COMPLETIONS = frozenset(
    {
        "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
        "max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options",
        "suffix", "temperature", "top_p", "user",
    }
)  # fmt: skip
_OPENAI_EMBEDDINGS = frozenset({"model", "input", "dimensions", "encoding_format", "user"})


def _openai_words(error: ApiError) -> ApiError:
    """vLLM's refusal in OpenAI's shape (``code`` a string or null, OpenAI's ``type``)."""
    inner = error.body.get("error") if isinstance(error.body, dict) else None
    if not isinstance(inner, dict):
        return error
    param = inner.get("param")
    code = "model_not_found" if error.status == 404 else None
    body = {
        "error": {
            "message": str(inner.get("message")),
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }
    return ApiError(status=error.status, body=body, headers=error.headers)


class EndpointsHandler:
    def __init__(self, shell: Shell, fingerprint: str) -> None:
        self._shell = shell
        self._config: SimConfig = shell.config
        self._fingerprint = fingerprint
        self._openai = self._config.dialect == "openai"

    async def _request(
        self, scope: Scope, receive: Receive, send: Send, fields: frozenset[str]
    ) -> dict[str, Any] | None:
        """The decoded body, or None once refused (or the client left)."""
        body = await read_body(receive)
        if body is None:
            return None
        self._shell.record(scope, body)
        data = decode_body(body)
        if isinstance(data, ApiError):
            await self._refuse(send, data)
            return None
        unknown = [name for name in data if name not in fields]
        if self._openai and unknown:
            message = f"Unrecognized request argument supplied: {unknown[0]}"
            await self._shell.refuse(send, _openai_words(errors.bad_request(message)))
            return None
        return data

    async def _refuse(self, send: Send, error: ApiError) -> None:
        await self._shell.refuse(send, _openai_words(error) if self._openai else error)

    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = await self._request(scope, receive, send, _OPENAI_EMBEDDINGS)
        if data is None:
            return
        request = parse_embeddings(data, self._config)
        if isinstance(request, ApiError):
            await self._refuse(send, request)
            return
        response_id = f"embd-{secrets.token_hex(8)}"
        model = self._config.served_model_name
        await send_json(send, 200, embeddings_body(request, response_id, int(time.time()), model))

    async def completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = await self._request(scope, receive, send, _OPENAI_COMPLETIONS)
        if data is None:
            return
        prompts = parse_completions(data, self._config)
        if isinstance(prompts, ApiError):
            await self._refuse(send, prompts)
            return
        shell, config = self._shell, self._config
        try:
            plans = [plan_generation(seq, config) for seq in prompts.sequences]
        except ScriptError as error:
            await shell.refuse(send, errors.script_error(str(error)))
            return
        fault_body = openai_wire.fault_body if self._openai else vllm_fault_body
        fault = plans[0].fault
        if fault is not None and shell.engine.fault_applies(plans[0].script_key, fault.times):
            await trio.sleep(plans[0].fault_delay_s)
            await shell.refuse(send, self._fault_error(fault))
            return
        ctx = ResponseContext(
            response_id=f"cmpl-{secrets.token_hex(8)}",
            created=int(time.time()),
            model=config.served_model_name,
            system_fingerprint=self._fingerprint,
            prompt_tokens=prompts.prompt_tokens,
            tool_call_ids=(),
            include_usage=prompts.include_usage,
            continuous_usage=prompts.continuous_usage,
            dialect=config.dialect,
            prompt_details=config.enable_prompt_tokens_details,
        )
        with ExitStack() as stack:
            seqs = [
                stack.enter_context(shell.sequence(request, plan))
                for request, plan in zip(prompts.sequences, plans, strict=True)
            ]
            if prompts.stream:
                parts: list[tuple[Any, Generation, Renderer]] = [
                    (seq, plan, CompletionRenderer(ctx, plan, i, request.prompt.tokens, fault_body))
                    for i, (seq, plan, request) in enumerate(
                        zip(seqs, plans, prompts.sequences, strict=True)
                    )
                ]
                generated = sum(len(plan.tokens) for plan in plans)

                def tail() -> list[bytes]:
                    usage = [usage_chunk(ctx, prompts.prompt_tokens, generated)]
                    return [*(usage if prompts.include_usage else []), SSE_DONE]

                await shell.stream_parts(scope, receive, send, parts, _SSE, tail)
                return
            produced: list[int] = []
            for seq, plan in zip(seqs, plans, strict=True):
                count = await shell.generate(scope, receive, seq, plan)
                if count is None:
                    return
                produced.append(count)
            body = completion_whole(
                ctx, list(zip(plans, produced, strict=True)), prompts.prompt_tokens
            )
            await shell.answer(send, plans[0], produced[0], dumps(body), self._fault_error)

    def _fault_error(self, fault: Fault) -> ApiError:
        if self._openai:
            return openai_wire.openai_fault(fault)
        return errors.simulated_fault(fault.status, fault.body, fault.retry_after, fault.error)
