"""Pure builders for vLLM 0.32.0's wire format: stream chunks, non-stream bodies, /v1/models,
/metrics. Key order matters to byte-comparing tests and is copied from the real transcripts in
tests/sim/fixtures/.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from . import errors
from .script import Fault, FinishReason, Generation, Token

__all__ = [
    "SSE_DONE",
    "ResponseContext",
    "StreamRenderer",
    "completion_body",
    "dumps",
    "metrics_text",
    "models_body",
    "sse",
    "vllm_fault_body",
]

VLLM_VERSION = "0.32.0"
SSE_DONE = b"data: [DONE]\n\n"


def dumps(value: Any) -> bytes:
    # pydantic's model_dump_json: compact, UTF-8 kept as is, control characters escaped.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def sse(value: Any) -> bytes:
    return b"data: " + dumps(value) + b"\n\n"


@attrs.frozen(kw_only=True)
class ResponseContext:
    """Per-response values the pure builders cannot make up themselves."""

    response_id: str  # "chatcmpl-<16 hex>"
    created: int
    model: str
    system_fingerprint: str
    prompt_tokens: int
    tool_call_ids: tuple[str, ...]  # "chatcmpl-tool-<16 hex>", one per tool call
    include_usage: bool = False
    continuous_usage: bool = False
    # "openai": OpenAI's own API. Reasoning is counted but never shown, vLLM's extra keys
    # are left out, and usage reports cached prompt tokens.
    dialect: str = "vllm"
    # vLLM's --enable-prompt-tokens-details: usage says how many prompt tokens were cached.
    prompt_details: bool = False


# Keys only vLLM writes; OpenAI's API has none of them.
_VLLM_ONLY = frozenset(
    {
        "prompt_token_ids", "prompt_text", "token_ids", "stop_reason", "routed_experts",
        "prompt_logprobs", "kv_transfer_params", "ec_transfer_params", "metrics", "reasoning",
    }
)  # fmt: skip


def _dialect(ctx: ResponseContext, value: dict[str, Any]) -> dict[str, Any]:
    if ctx.dialect != "openai":
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in _VLLM_ONLY:
            continue
        if isinstance(item, dict):
            item = _dialect(ctx, item)
        elif isinstance(item, list):
            item = [_dialect(ctx, x) if isinstance(x, dict) else x for x in item]
        out[key] = item
    return out


def _stream_usage(
    ctx: ResponseContext, completion: int, reasoning: int, cached: int = 0, *, final: bool = True
) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": ctx.prompt_tokens,
        "total_tokens": ctx.prompt_tokens + completion,
        "completion_tokens": completion,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    if ctx.dialect == "openai":
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    elif ctx.prompt_details and final:
        # vLLM 0.32 with --enable-prompt-tokens-details, seen in the real-vLLM tier: only the
        # last usage chunk has the details (not continuous_usage_stats' per-chunk usage).
        usage["prompt_tokens_details"] = {
            "cached_tokens": cached,
            "created_cache_tokens": _created_cache_tokens(ctx.prompt_tokens, cached),
        }
    return usage


def _whole_prompt_details(ctx: ResponseContext, cached: int) -> dict[str, Any] | None:
    if ctx.dialect == "openai":
        return {"cached_tokens": cached}
    if ctx.prompt_details:
        created = _created_cache_tokens(ctx.prompt_tokens, cached)
        return {"cached_tokens": cached, "created_cache_tokens": created, "multimodal_tokens": None}
    return None


def _created_cache_tokens(prompt_tokens: int, cached: int) -> int:
    """vLLM's count of prompt tokens it wrote into the prefix cache: the full 16-token blocks
    of all but the last token, less those it found there (2,015 prompt tokens: 1,920)."""
    return max(0, (prompt_tokens - 1) // 16 * 16 - cached)


def _delta(token: Token, ctx: ResponseContext) -> dict[str, Any] | None:
    if token.kind == "reasoning":
        # OpenAI's Chat Completions never return reasoning text, only its token count.
        return None if ctx.dialect == "openai" else {"reasoning": token.text}
    if token.kind == "content":
        return {"content": token.text}
    if token.kind == "tool_name":
        call = {
            "id": ctx.tool_call_ids[token.tool_index],
            "type": "function",
            "index": token.tool_index,
            "function": {"name": token.text},
        }
        return {"content": None, "tool_calls": [call]}
    if token.kind == "tool_args":
        piece = {"index": token.tool_index, "function": {"arguments": token.text}}
        return {"content": None, "tool_calls": [piece]}
    return None


class StreamRenderer:
    """Turns "token i was generated" into SSE events, the way vLLM's serving layer does.

    Pure but stateful, like an incremental encoder: feed `token(i)` for i = 0, 1, ... in order.
    The first token also brings the `role` chunk (vLLM sends it with the first engine output,
    so it waits behind the queue too); the last one carries `finish_reason`, merged into that
    token's chunk when the token is visible, as a chunk with an empty delta otherwise.
    """

    def __init__(
        self,
        ctx: ResponseContext,
        generation: Generation,
        fault_body: Callable[[Fault], Any] | None = None,
    ) -> None:
        self._ctx = ctx
        self._tokens = generation.tokens
        self._finish: FinishReason = generation.finish_reason
        self._reasoning = 0
        self._cached = 0
        self._fault_body = fault_body or vllm_fault_body

    def stream_error(self, fault: Fault) -> list[bytes]:
        # vLLM's serving layer writes a failing stream's error as one more event, then [DONE];
        # the openai SDK raises on a chunk with an `error` key.
        return [sse(self._fault_body(fault)), SSE_DONE]

    def _chunk(self, choice: dict[str, Any], completion: int) -> dict[str, Any]:
        ctx = self._ctx
        chunk: dict[str, Any] = {
            "id": ctx.response_id,
            "object": "chat.completion.chunk",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [choice],
        }
        if ctx.continuous_usage:
            chunk["usage"] = _stream_usage(
                ctx, completion, self._reasoning, self._cached, final=False
            )
        return chunk

    def token(self, index: int, cached_tokens: int = 0) -> list[bytes]:
        # None stands for the closing [DONE].
        return [
            SSE_DONE if chunk is None else sse(_dialect(self._ctx, chunk))
            for chunk in self._chunks(index, cached_tokens)
        ]

    def _chunks(self, index: int, cached_tokens: int) -> list[dict[str, Any] | None]:
        events: list[dict[str, Any] | None] = []
        if index == 0:
            self._cached = cached_tokens
            first = self._chunk(
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                },
                0,
            )
            first["prompt_token_ids"] = None
            first["prompt_text"] = None
            events.append(first)
        token = self._tokens[index]
        if token.kind == "reasoning":
            self._reasoning += 1
        delta = _delta(token, self._ctx)
        last = index == len(self._tokens) - 1
        if not last:
            if delta is not None:  # vLLM sends nothing for a token that shows nothing
                choice = {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": None,
                    "token_ids": None,
                }
                events.append(self._chunk(choice, index + 1))
            return events
        choice = {
            "index": 0,
            "delta": delta or {},
            "logprobs": None,
            "finish_reason": self._finish,
            "stop_reason": None,
            "token_ids": None,
        }
        final = self._chunk(choice, index + 1)
        if not self._ctx.include_usage:
            final["system_fingerprint"] = self._ctx.system_fingerprint
        events.append(final)
        if self._ctx.include_usage:
            usage_chunk = {
                "id": self._ctx.response_id,
                "object": "chat.completion.chunk",
                "created": self._ctx.created,
                "model": self._ctx.model,
                "choices": [],
                "usage": _stream_usage(self._ctx, index + 1, self._reasoning, self._cached),
                "system_fingerprint": self._ctx.system_fingerprint,
            }
            events.append(usage_chunk)
        events.append(None)  # [DONE]
        return events


def vllm_fault_body(fault: Fault) -> Any:
    return errors.simulated_fault(fault.status, fault.body, fault.retry_after, fault.error).body


def completion_body(
    ctx: ResponseContext, generation: Generation, produced: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """The non-stream body after `produced` tokens (all of them, unless cut short)."""
    return _dialect(ctx, _completion_body(ctx, generation, produced, cached_tokens))


def _completion_body(
    ctx: ResponseContext, generation: Generation, produced: int, cached_tokens: int
) -> dict[str, Any]:
    tokens = generation.tokens[:produced]
    reasoning = [t.text for t in tokens if t.kind == "reasoning"]
    content = [t.text for t in tokens if t.kind == "content"]
    calls: dict[int, dict[str, Any]] = {}
    for t in tokens:
        if t.kind == "tool_name":
            calls[t.tool_index] = {
                "id": ctx.tool_call_ids[t.tool_index],
                "type": "function",
                "function": {"name": t.text, "arguments": ""},
            }
        elif t.kind == "tool_args" and t.tool_index in calls:
            calls[t.tool_index]["function"]["arguments"] += t.text
    text = "".join(content)
    if calls and not text.strip():
        # vLLM drops whitespace-only content next to parsed tool calls (the "\n\n" Qwen3
        # writes after </think>); a stream still sends it as content deltas.
        text = ""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text or None,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    message["reasoning"] = "".join(reasoning) or None
    return {
        "id": ctx.response_id,
        "object": "chat.completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": generation.finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "routed_experts": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": ctx.system_fingerprint,
        "usage": {
            "prompt_tokens": ctx.prompt_tokens,
            "total_tokens": ctx.prompt_tokens + len(tokens),
            "completion_tokens": len(tokens),
            "prompt_tokens_details": _whole_prompt_details(ctx, cached_tokens),
            "completion_tokens_details": {"reasoning_tokens": len(reasoning)},
        },
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def _hex16(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:16]


def models_body(
    served_model_name: str, root: str, max_model_len: int, created: int
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": served_model_name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        # vLLM: "modelperm-" + 16 random hex; here derived, to stay pure.
                        "id": "modelperm-" + _hex16(f"{served_model_name}|{root}|{created}"),
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }


# (name, type, help); counters are listed by their exposed name, `_total` included.
_METRICS: Sequence[tuple[str, str, str]] = (
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of tokens."),
    ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of tokens."),
    ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine."),
    ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed."),
)


def metrics_text(model_name: str, values: dict[str, float]) -> str:
    """Prometheus text exposition of the metrics in `values` (keyed by exposed name), plus
    `vllm:request_success_total` by finish reason from the `success:<reason>` keys."""
    labels = f'engine="0",model_name="{model_name}"'
    lines: list[str] = []
    for name, kind, help_text in _METRICS:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{{{labels}}} {float(values.get(name, 0.0))!r}")
    name = "vllm:request_success_total"
    lines.append(f"# HELP {name} Count of successfully processed requests.")
    lines.append(f"# TYPE {name} counter")
    for reason in ("stop", "length", "abort"):
        value = float(values.get(f"success:{reason}", 0.0))
        lines.append(
            f'{name}{{engine="0",finished_reason="{reason}",model_name="{model_name}"}} {value!r}'
        )
    return "\n".join(lines) + "\n"
