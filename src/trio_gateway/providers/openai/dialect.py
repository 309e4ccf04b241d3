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
from trio_gateway.core.request import ChatRequest
from trio_gateway.providers.dialect import UpstreamCall
from trio_gateway.providers.errors import error_message_and_param
from trio_gateway.providers.openai.model_rules import apply_model_rules
from trio_gateway.providers.openai_compatible.dialect import OpenAICompatibleDialect

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


def build_body(request: ChatRequest, provider: ProviderConfig) -> dict[str, Any]:
    strip = frozenset(provider.strip_fields)
    body = {k: v for k, v in request.body.items() if k in OPENAI_FIELDS and k not in strip}
    max_tokens = request.body.get("max_tokens") if "max_tokens" not in strip else None
    body.pop("max_tokens", None)
    if "max_completion_tokens" not in body and max_tokens is not None:
        body["max_completion_tokens"] = max_tokens
    apply_model_rules(body, request, provider)
    body["model"] = provider.model
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


class OpenAIDialect(OpenAICompatibleDialect):
    def build_call(self, request: ChatRequest, provider: ProviderConfig) -> UpstreamCall:
        return UpstreamCall(
            url=provider.endpoint + "/chat/completions",
            body=json.dumps(build_body(request, provider), ensure_ascii=False).encode(),
            headers={"content-type": "application/json", "accept": "text/event-stream"},
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
