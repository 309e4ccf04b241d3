"""Pure parts of the `openai` dialect: OpenAI's own Chat Completions API, as opposed to vLLM's.

The output is vLLM's wire (`wire.py`) without vLLM's extra keys and without reasoning text;
what differs is the request check (unknown and vLLM-only fields are refused) and the errors,
whose `code` is a string (or null) and whose `type` is OpenAI's vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from . import errors
from .config import SimConfig
from .errors import ApiError
from .request import ChatRequest, chat_request_from, decode_body
from .script import Fault
from .text import count_prompt
from .vendor_models import openai_default_effort, openai_refusal

__all__ = [
    "fault_body",
    "openai_fault",
    "parse_openai_request",
    "unauthorized",
]

# Chat Completions' documented request fields; anything else is "Unrecognized".
_FIELDS = frozenset(
    {
        "messages", "model", "audio", "frequency_penalty", "function_call", "functions",
        "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata",
        "modalities", "n", "parallel_tool_calls", "prediction", "presence_penalty",
        "prompt_cache_key", "prompt_cache_retention", "reasoning_effort", "response_format",
        "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
        "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p",
        "user", "verbosity", "web_search_options",
    }
)  # fmt: skip
_STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
# The vLLM builders' 400 `param` for a prompt over the context.
_VLLM_CONTEXT_PARAM = "input_tokens"

# OpenAI's `type` and `code` for a scripted status without its own `error` name.
_FAULTS: Mapping[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Bad request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Forbidden."),
    404: ("invalid_request_error", "model_not_found", "Not found."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached. Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later"),
}


def _error(
    status: int,
    message: str,
    *,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> ApiError:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return ApiError(status=status, body=body, headers=headers)


def unauthorized() -> ApiError:
    return _error(
        401,
        "Incorrect API key provided. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        code="invalid_api_key",
    )


def fault_body(fault: Fault) -> Any:
    if fault.body is not None:
        return fault.body
    type_, code, message = _FAULTS.get(
        fault.status, ("server_error" if fault.status >= 500 else "invalid_request_error", None, "")
    )
    if fault.error == "insufficient_quota":
        # Not a rate limit: the account is out of credit, and a retry will not help.
        type_, code = "insufficient_quota", "insufficient_quota"
        message = "You exceeded your current quota, please check your plan and billing details."
    elif fault.error is not None:
        code = fault.error
    body = {"message": message or f"simulated HTTP {fault.status}", "type": type_}
    return {"error": {**body, "param": None, "code": code}}


def openai_fault(fault: Fault) -> ApiError:
    return ApiError(
        status=fault.status,
        body=fault_body(fault),
        headers=errors.retry_after_header(fault.retry_after),
    )


def _unknown_field(data: Mapping[str, Any]) -> ApiError | None:
    for name in data:
        if name not in _FIELDS:
            return _error(400, f"Unrecognized request argument supplied: {name}")
    options = data.get("stream_options")
    if isinstance(options, Mapping):
        for name in options:
            if name not in _STREAM_OPTIONS:
                param = f"stream_options.{name}"
                return _error(
                    400, f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter"
                )
    effort = data.get("reasoning_effort")
    if effort is not None and effort not in _EFFORTS:
        message = (
            f"Invalid value: '{effort}'. Supported values are: "
            + ", ".join(f"'{e}'" for e in _EFFORTS)
            + "."
        )
        return _error(400, message, param="reasoning_effort", code="invalid_value")
    return None


def _from_vllm(error: ApiError, data: Mapping[str, Any], config: SimConfig) -> ApiError:
    """vLLM's refusal of the same request, in OpenAI's words."""
    inner = error.body.get("error") if isinstance(error.body, dict) else None
    if not isinstance(inner, dict):
        return error
    param = inner.get("param")
    if error.status == 404 and param == "model":
        message = f"The model `{data.get('model')}` does not exist or you do not have access to it."
        return _error(404, message, code="model_not_found")
    if param == _VLLM_CONTEXT_PARAM:
        thinking = data.get("reasoning_effort") != "none"
        tools = data.get("tools") or None
        tokens = count_prompt(data["messages"], tools, thinking=thinking).tokens
        message = (
            f"This model's maximum context length is {config.max_model_len} tokens. However, "
            f"your messages resulted in {tokens} tokens. Please reduce the length of the "
            "messages."
        )
        return _error(400, message, param="messages", code="context_length_exceeded")
    return _error(error.status, str(inner.get("message")), param=param)


def parse_openai_request(body: bytes, config: SimConfig) -> ChatRequest | ApiError:
    data = decode_body(body)
    if isinstance(data, ApiError):
        return _error(400, "We could not parse the JSON body of your request.")
    problem = _unknown_field(data)
    if problem is not None:
        return problem
    served = config.served_model_name
    if data.get("model") == served and (refusal := openai_refusal(served, data)) is not None:
        return _error(400, refusal.message, param=refusal.param, code=refusal.code)
    # The model reasons at its default effort unless told otherwise; vLLM's switch for that is
    # a template kwarg.
    thinking = (data.get("reasoning_effort") or openai_default_effort(served)) != "none"
    translated = {
        key: value for key, value in data.items() if key not in ("reasoning_effort", "verbosity")
    }
    translated["chat_template_kwargs"] = {"enable_thinking": thinking}
    # OpenAI's models always have a tool parser: tool_choice "auto" is never refused.
    request = chat_request_from(translated, _with_tool_parser(config), blank_after_think=False)
    if isinstance(request, ApiError):
        return _from_vllm(request, data, config)
    return request


def _with_tool_parser(config: SimConfig) -> SimConfig:
    return config if config.tool_call_parser else attrs.evolve(config, tool_call_parser=True)
