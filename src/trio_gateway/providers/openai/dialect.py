"""The ``openai`` provider type: OpenAI's own Chat Completions API.

The wire is the one ``openai_compatible`` parses, so the parser is shared; what differs is the
request. OpenAI rejects fields it does not know (``Unrecognized request argument supplied``), so
only its own fields are sent: vLLM's extensions (``chat_template_kwargs``, ``top_k``, ...) and the
gateway's own are dropped. Reasoning is ``reasoning_effort``, as the model's family takes it
(``model_rules.py``); ``max_tokens`` is sent as ``max_completion_tokens``, the only one reasoning
models take.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import GatewayError, QuotaExhausted
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.request import ChatRequest
from trio_gateway.providers.dialect import UpstreamCall
from trio_gateway.providers.errors import error_message_and_param
from trio_gateway.providers.openai.model_rules import apply_model_rules
from trio_gateway.providers.openai_compatible.dialect import (
    CALL_HEADERS,
    JSON_CALL_HEADERS,
    OpenAICompatibleDialect,
)
from trio_gateway.providers.openai_compatible.endpoints import MAX_EMBEDDINGS_BYTES, KindReader
from trio_gateway.providers.translate import without_reasoning_details

# Chat Completions request fields as OpenAI documents them; anything else is not sent.
OPENAI_FIELDS = frozenset(
    {
        "messages",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "metadata",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
# The legacy Completions and the Embeddings request fields as OpenAI documents them.
OPENAI_COMPLETIONS_FIELDS = frozenset(
    {
        "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
        "max_tokens", "n", "presence_penalty", "seed", "stop", "suffix", "temperature",
        "top_p", "user",
    }
)  # fmt: skip
OPENAI_EMBEDDINGS_FIELDS = frozenset({"input", "dimensions", "encoding_format", "user"})


def build_body(request: ChatRequest, provider: ProviderConfig) -> dict[str, Any]:
    strip = frozenset(provider.strip_fields)
    body = {k: v for k, v in request.body.items() if k in OPENAI_FIELDS and k not in strip}
    if "messages" in body:
        body["messages"] = without_reasoning_details(body["messages"])
    max_tokens = request.body.get("max_tokens") if "max_tokens" not in strip else None
    body.pop("max_tokens", None)
    if "max_completion_tokens" not in body and max_tokens is not None:
        body["max_completion_tokens"] = max_tokens
    apply_model_rules(body, request, provider)
    body["model"] = provider.model
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


def _only(request: ChatRequest, provider: ProviderConfig, fields: frozenset[str]) -> dict[str, Any]:
    strip = frozenset(provider.strip_fields)
    body = {k: v for k, v in request.body.items() if k in fields and k not in strip}
    body["model"] = provider.model
    return body


class OpenAIDialect(OpenAICompatibleDialect):
    def build_chat_call(self, request: ChatRequest, provider: ProviderConfig) -> UpstreamCall:
        return UpstreamCall(
            url=provider.endpoint + "/chat/completions",
            body=json.dumps(build_body(request, provider), ensure_ascii=False).encode(),
            headers={"content-type": "application/json", "accept": "text/event-stream"},
        )

    def build_completions_call(
        self, request: ChatRequest, provider: ProviderConfig
    ) -> UpstreamCall:
        body = _only(request, provider, OPENAI_COMPLETIONS_FIELDS)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        return UpstreamCall(
            url=provider.endpoint + "/completions",
            body=json.dumps(body, ensure_ascii=False).encode(),
            headers=CALL_HEADERS,
            reader=KindReader(RequestKind.COMPLETIONS, self.classify_error),
        )

    def build_embeddings_call(self, request: ChatRequest, provider: ProviderConfig) -> UpstreamCall:
        body = _only(request, provider, OPENAI_EMBEDDINGS_FIELDS)
        return UpstreamCall(
            url=provider.endpoint + "/embeddings",
            body=json.dumps(body, ensure_ascii=False).encode(),
            headers=JSON_CALL_HEADERS,
            reader=KindReader(RequestKind.EMBEDDINGS, self.classify_error),
            max_whole_bytes=MAX_EMBEDDINGS_BYTES,
        )

    def classify_error(
        self, provider: str, status: int, body: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        message, _, code = error_message_and_param(body)
        if status == 429 and code == "insufficient_quota":
            # Not a rate limit: waiting does not bring the quota back.
            return QuotaExhausted(
                f"{provider}: the OpenAI account has no quota left: {message}", provider=provider
            )
        return super().classify_error(provider, status, body, headers)
