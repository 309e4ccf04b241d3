"""The bodies of ``POST /v1/completions`` and ``POST /v1/embeddings``, checked at the front as
the chat body is (``validation.py``): OpenAI's rules, in OpenAI's words, before any provider is
chosen; a request that passes becomes a :class:`~trio_gateway.core.request.ChatRequest` of its
kind, which routing, admission and the providers read as they read a chat request.

Pure. Only the fields OpenAI defines are checked; others (vLLM's ``top_k``, ``ignore_eos``,
``truncate_prompt_tokens`` ...) pass through to an ``openai_compatible`` provider as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.request import ChatRequest, read_chat_json
from trio_gateway.core.validation import FIELD_CHECKS, within_depth
from trio_gateway.core.validation import _depth as check_depth
from trio_gateway.core.validation_values import (
    Check,
    array,
    boolean,
    enum_value,
    invalid,
    json_object,
    number,
    optional_fields,
    required,
    string,
    wrong_type,
)

# OpenAI's bound on the texts of one embeddings request, taken for completions' prompts too:
# each prompt is a sequence of its own upstream, and each a choice of the answer.
MAX_INPUTS: Final = 2048
# The largest token id any vocabulary has is far below this; it keeps ids in 32 bits.
MAX_TOKEN_ID: Final = 2**31 - 1
# What OpenAI and vLLM generate for a completion that names no max_tokens (their default).
COMPLETIONS_DEFAULT_MAX_TOKENS: Final = 16
ENCODING_FORMATS: Final = ("float", "base64")
_NOTHING: frozenset[Any] = frozenset()


def _token_ids(path: str, value: list[Any]) -> None:
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int):
            raise wrong_type(f"{path}[{i}]", "an integer", token)
        if not 0 <= token <= MAX_TOKEN_ID:
            raise invalid(f"{path}[{i}]", f"token id {token} is out of range.")


def _texts_or_tokens(path: str, value: object, *, allow_empty_text: bool) -> None:
    """A text, a list of texts, a list of token ids, or a list of lists of token ids: what
    both endpoints take as their input (OpenAI's four forms, never mixed)."""
    expected = "a string, an array of strings, an array of integers or an array of arrays"
    if isinstance(value, str):
        if not value and not allow_empty_text:
            raise invalid(path, "empty string. Expected a non-empty string.")
        return
    items = array(path, value, min_items=1, max_items=MAX_INPUTS, expected=expected)
    first = items[0]
    if isinstance(first, str):
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise wrong_type(f"{path}[{i}]", "a string", item)
            if not item and not allow_empty_text:
                raise invalid(f"{path}[{i}]", "empty string. Expected a non-empty string.")
    elif isinstance(first, list):
        for i, item in enumerate(items):
            tokens = array(f"{path}[{i}]", item, min_items=1, expected="an array of integers")
            _token_ids(f"{path}[{i}]", tokens)
    else:
        _token_ids(path, items)


def _stream_options(path: str, value: object) -> None:
    optional_fields(path, json_object(path, value), {"include_usage": boolean})


def _logprobs(path: str, value: object) -> None:
    number("integer", 0, 5)(path, value)
    # Valid at OpenAI, but the gateway's events carry text, not log probabilities.
    raise UnsupportedParameter("logprobs are not supported by the gateway", param=path)


COMPLETIONS_FIELDS: Final[Mapping[str, Check]] = MappingProxyType(
    {
        "stream": boolean,
        "stream_options": _stream_options,
        "max_tokens": number("integer", 0),
        "n": number("integer", 1, 128),
        "best_of": number("integer", 0, 20),
        "echo": boolean,
        "suffix": string,
        "logprobs": _logprobs,
        "temperature": FIELD_CHECKS["temperature"],
        "top_p": FIELD_CHECKS["top_p"],
        "presence_penalty": FIELD_CHECKS["presence_penalty"],
        "frequency_penalty": FIELD_CHECKS["frequency_penalty"],
        "seed": FIELD_CHECKS["seed"],
        "logit_bias": FIELD_CHECKS["logit_bias"],
        "stop": FIELD_CHECKS["stop"],
        "user": string,
    }
)

EMBEDDINGS_FIELDS: Final[Mapping[str, Check]] = MappingProxyType(
    {
        "encoding_format": lambda path, value: enum_value(path, value, ENCODING_FORMATS),
        "dimensions": number("integer", 1),
        "user": string,
    }
)


def _object_with_alias(body: object, raw: bytes) -> tuple[dict[str, Any], str]:
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    alias = body.get("model")
    if not isinstance(alias, str) or not alias:
        raise InvalidRequest("'model' must be a non-empty string (an alias)", param="model")
    if not within_depth(raw):
        check_depth(body)
    return body, alias


def parse_completions_request(raw: bytes) -> ChatRequest:
    """Validate a ``/v1/completions`` body; raise a ``RequestError`` saying what is wrong."""
    return completions_request(read_chat_json(raw), raw)


def completions_request(decoded: object, raw: bytes) -> ChatRequest:
    """:func:`parse_completions_request` of a body the front has decoded already (to learn
    its alias before validation can refuse it)."""
    body, alias = _object_with_alias(decoded, raw)
    _texts_or_tokens("prompt", required(body, "prompt", ""), allow_empty_text=True)
    optional_fields("", body, COMPLETIONS_FIELDS)
    stream = body.get("stream") is True
    if body.get("stream_options") is not None and not stream:
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
        )
    options = body.get("stream_options") or {}
    return ChatRequest(
        alias=alias,
        body=body,
        stream=stream,
        include_usage=stream and options.get("include_usage") is True,
        reasoning=None,
        required=_NOTHING,
        kind=RequestKind.COMPLETIONS,
    )


def parse_embeddings_request(raw: bytes) -> ChatRequest:
    """Validate a ``/v1/embeddings`` body; raise a ``RequestError`` saying what is wrong."""
    return embeddings_request(read_chat_json(raw), raw)


def embeddings_request(decoded: object, raw: bytes) -> ChatRequest:
    """:func:`parse_embeddings_request` of a body the front has decoded already."""
    body, alias = _object_with_alias(decoded, raw)
    _texts_or_tokens("input", required(body, "input", ""), allow_empty_text=False)
    optional_fields("", body, EMBEDDINGS_FIELDS)
    return ChatRequest(
        alias=alias,
        body=body,
        stream=False,
        include_usage=False,
        reasoning=None,
        required=_NOTHING,
        kind=RequestKind.EMBEDDINGS,
    )


def prompt_count(request: ChatRequest) -> int:
    """How many prompts (or inputs) a request holds: one per text or token list."""
    return _count(
        request.body.get("prompt" if request.kind is RequestKind.COMPLETIONS else "input")
    )


def completion_choices(body: Mapping[str, object]) -> int:
    """The choices a validated completions body asks for: each prompt, ``n`` times."""
    n = body.get("n")
    return _count(body.get("prompt")) * (n if type(n) is int and n > 0 else 1)


def _count(value: object) -> int:
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        return len(value)
    return 1
