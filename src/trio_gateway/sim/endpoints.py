"""Pure parts of ``/v1/completions`` and ``/v1/embeddings``, as vLLM 0.32.0 serves them (seen
in the real-vLLM tier): the request checks in vLLM's words, the ``text_completion`` chunks and
bodies, and the embeddings list (floats, or base64 of little-endian float32s).

A completion's prompt has no chat template: a text counts as its tokens (``text.split_text``),
a list of token ids as its length. Each prompt (times ``n``) is a sequence of its own, and a
choice of the answer (index ``prompt * n + i``, vLLM's order). A ``<sim>`` script in a prompt
steers that prompt's text as it steers a chat answer (there is no thinking here).
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from . import errors
from .config import SimConfig
from .errors import ApiError
from .request import ChatRequest
from .script import Fault, Generation
from .text import PromptInfo, prompt_info, split_text
from .wire import SSE_DONE, ResponseContext, _dialect, sse

__all__ = [
    "EmbeddingsRequest",
    "Prompts",
    "completion_whole",
    "embedding",
    "embeddings_body",
    "parse_completions",
    "parse_embeddings",
]

# vLLM's default for a completion that names no max_tokens (OpenAI's too).
DEFAULT_MAX_TOKENS = 16
ENCODING_FORMATS = ("float", "base64")


@attrs.frozen(kw_only=True)
class Prompts:
    """A validated completions request: one sim ``ChatRequest`` per sequence, in choice order."""

    sequences: tuple[ChatRequest, ...]
    # The prompts' tokens, each prompt once however many choices it has (vLLM counts so).
    prompt_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool


@attrs.frozen(kw_only=True)
class EmbeddingsRequest:
    inputs: tuple[tuple[str | int, ...], ...]  # each input's tokens (texts' pieces, or ids)
    base64: bool
    dimensions: int


def _texts(value: object, name: str) -> list[str | list[int]] | ApiError:
    """A prompt (or input) in its four forms, as a list of texts or of token-id lists."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        return errors.validation_error("list_type", (name,), "Input should be a valid list")
    if not value:
        return errors.bad_request("You must pass at least one prompt")
    if all(type(x) is int for x in value):
        return [list(value)]
    out: list[str | list[int]] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list) and all(type(x) is int for x in item):
            out.append(list(item))
        else:
            return errors.validation_error(
                "string_type", (name, i), "Input should be a valid string"
            )
    return out


def _pieces(prompt: str | list[int]) -> tuple[str | int, ...]:
    return split_text(prompt) if isinstance(prompt, str) else tuple(prompt)


def _max_tokens(data: Mapping[str, Any], config: SimConfig) -> int | ApiError:
    requested = data.get("max_tokens")
    if requested is None:
        return DEFAULT_MAX_TOKENS
    if isinstance(requested, bool) or not isinstance(requested, int):
        return errors.validation_error(
            "int_type", ("max_tokens",), "Input should be a valid integer"
        )
    if requested > config.max_model_len:
        return errors.max_tokens_too_large(requested, config.max_model_len)
    if requested < 1:
        return errors.max_tokens_too_small(requested)
    return requested


def parse_completions(data: Mapping[str, Any], config: SimConfig) -> Prompts | ApiError:
    """Check a decoded ``/v1/completions`` body in vLLM's order."""
    model = data.get("model")
    if model is not None and model != config.served_model_name:
        return errors.model_not_found(str(model), config.served_model_name)
    prompt = data.get("prompt")
    if prompt is None or prompt == "":
        return errors.bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
            "prompt",
        )
    prompts = _texts(prompt, "prompt")
    if isinstance(prompts, ApiError):
        return prompts
    stream = data.get("stream")
    options = data.get("stream_options")
    if options is not None and stream is not True:
        return errors.bad_request(
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "stream_options",
        )
    max_tokens = _max_tokens(data, config)
    if isinstance(max_tokens, ApiError):
        return max_tokens
    n = data.get("n") or 1
    if type(n) is not int or n < 1:
        return errors.validation_error("int_type", ("n",), "Input should be a valid integer")
    sequences: list[ChatRequest] = []
    prompt_tokens = 0
    for text in prompts:
        info = prompt_info(_pieces(text))
        if info.tokens >= config.max_model_len:
            return errors.context_too_long(config.max_model_len, info.tokens)
        content = text if isinstance(text, str) else " ".join(map(str, text))
        request = _sequence(content, info, min(max_tokens, config.max_model_len - info.tokens))
        sequences.extend([request] * n)
        prompt_tokens += info.tokens
    flags = options if isinstance(options, dict) else {}
    usage = flags.get("include_usage") is True
    return Prompts(
        sequences=tuple(sequences),
        prompt_tokens=prompt_tokens,
        stream=stream is True,
        include_usage=usage,
        continuous_usage=usage and flags.get("continuous_usage_stats") is True,
    )


def _sequence(content: str, info: PromptInfo, max_tokens: int) -> ChatRequest:
    # The script language reads the last user message: the prompt is that message here.
    return ChatRequest(
        messages=({"role": "user", "content": content},),
        stream=False,
        include_usage=False,
        continuous_usage=False,
        max_tokens=max_tokens,
        ignore_eos=False,
        thinking=False,
        parse_tools=False,
        parallel_tool_calls=True,
        prompt=info,
        blank_after_think=False,
    )


def _visible(generation: Generation, produced: int) -> str:
    return "".join(t.text for t in generation.tokens[:produced] if t.kind != "hidden")


class CompletionRenderer:
    """One choice's ``text_completion`` chunks, token by token (``shell.Renderer``): a chunk
    per visible token, the last one with its ``finish_reason``."""

    def __init__(
        self,
        ctx: ResponseContext,
        generation: Generation,
        index: int,
        prompt_tokens: int,
        fault_body: Callable[[Fault], Any],
    ) -> None:
        self._fault_body = fault_body
        self._ctx = ctx
        self._generation = generation
        self._index = index
        self._prompt_tokens = prompt_tokens

    def token(self, index: int, cached_tokens: int = 0) -> list[bytes]:
        tokens = self._generation.tokens
        token = tokens[index]
        last = index == len(tokens) - 1
        text = "" if token.kind == "hidden" else token.text
        if not text and not last:
            return []  # vLLM sends nothing for a token that shows nothing
        choice = {
            "index": self._index,
            "text": text,
            "logprobs": None,
            "finish_reason": self._generation.finish_reason if last else None,
            "stop_reason": None,
            "prompt_token_ids": None,
            "token_ids": None,
        }
        ctx = self._ctx
        chunk: dict[str, Any] = {
            "id": ctx.response_id,
            "object": "text_completion",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [choice],
        }
        if ctx.continuous_usage:
            chunk["usage"] = _usage(self._prompt_tokens, index + 1)
        return [sse(_dialect(ctx, chunk))]

    def stream_error(self, fault: Fault) -> list[bytes]:
        # As a failing chat stream: the error as one more event, then [DONE].
        return [sse(self._fault_body(fault)), SSE_DONE]


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def usage_chunk(ctx: ResponseContext, prompt: int, completion: int) -> bytes:
    """The closing usage chunk of a stream that asked for it (``include_usage``)."""
    usage = _usage(prompt, completion)
    if ctx.prompt_details or ctx.dialect == "openai":
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    chunk = {
        "id": ctx.response_id,
        "object": "text_completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": [],
        "usage": usage,
        "system_fingerprint": ctx.system_fingerprint,
    }
    return sse(_dialect(ctx, chunk))


def completion_whole(
    ctx: ResponseContext, parts: list[tuple[Generation, int]], prompt_tokens: int
) -> dict[str, Any]:
    """The non-stream body: each choice's text after ``produced`` tokens."""
    completion = sum(produced for _, produced in parts)
    body = {
        "id": ctx.response_id,
        "object": "text_completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": [
            {
                "index": i,
                "text": _visible(generation, produced),
                "logprobs": None,
                "finish_reason": generation.finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
            for i, (generation, produced) in enumerate(parts)
        ],
        "service_tier": None,
        "system_fingerprint": ctx.system_fingerprint,
        "usage": {
            **_usage(prompt_tokens, completion),
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
    return _dialect(ctx, body)


def parse_embeddings(data: Mapping[str, Any], config: SimConfig) -> EmbeddingsRequest | ApiError:
    """Check a decoded ``/v1/embeddings`` body as vLLM's pooling server does."""
    model = data.get("model")
    if model is not None and model != config.served_model_name:
        return errors.model_not_found(str(model), config.served_model_name)
    if "input" not in data:
        return errors.validation_error("missing", ("input",), "Field required")
    inputs = _texts(data["input"], "input")
    if isinstance(inputs, ApiError):
        return inputs
    if any(text == "" for text in inputs):
        return errors.bad_request("The decoder prompt cannot be empty")
    encoding = data.get("encoding_format") or "float"
    if encoding not in ENCODING_FORMATS:
        return errors.validation_error(
            "literal_error", ("encoding_format",), "Input should be 'float' or 'base64'"
        )
    dimensions = data.get("dimensions")
    native = config.embedding_dimensions
    if dimensions is not None and config.dialect != "openai":
        return errors.bad_request(
            f"Model '{config.served_model_name}' does not support Matryoshka embeddings; "
            f"dimensions must be unset (received dimensions={dimensions})."
        )
    if dimensions is not None and (type(dimensions) is not int or not 1 <= dimensions <= native):
        return errors.bad_request(f"dimensions must be between 1 and {native}", "dimensions")
    pieces = tuple(_pieces(text) for text in inputs)
    for tokens in pieces:
        if len(tokens) >= config.max_model_len:
            return errors.context_too_long(config.max_model_len, len(tokens))
    return EmbeddingsRequest(
        inputs=pieces, base64=encoding == "base64", dimensions=dimensions or native
    )


def embedding(tokens: tuple[str | int, ...], dimensions: int) -> list[float]:
    """A unit vector drawn from the input's tokens: the same input, the same vector."""
    seed = hashlib.blake2b("\x00".join(map(str, tokens)).encode(), digest_size=8).digest()
    state = int.from_bytes(seed, "big")
    values = []
    for _ in range(dimensions):
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        values.append((state >> 11) / 2**53 - 0.5)
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    # Rounded through float32, as the model's output is.
    return [struct.unpack("<f", struct.pack("<f", v / norm))[0] for v in values]


def embeddings_body(
    request: EmbeddingsRequest, response_id: str, created: int, model: str
) -> dict[str, Any]:
    data = []
    for index, tokens in enumerate(request.inputs):
        vector = embedding(tokens, request.dimensions)
        value: list[float] | str = vector
        if request.base64:
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"index": index, "object": "embedding", "embedding": value})
    prompt = sum(len(tokens) for tokens in request.inputs)
    return {
        "id": response_id,
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": {
            "prompt_tokens": prompt,
            "total_tokens": prompt,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
    }
