"""The simulator's configuration: one frozen record of simple fields.

Every field maps one-to-one to a CLI flag (see `cli.py`) and to a TOML key (the gateway structures
this class with a strict cattrs converter), so fields stay plain `str`, `int`, `float`, `bool` or
`str | None`. Defaults describe a small, fast Qwen3 deployment suitable for tests.
"""

from __future__ import annotations

import attrs
from attrs import validators as v

__all__ = ["DIALECTS", "RUNNERS", "SCHEDULING_POLICIES", "SimConfig"]

# The wire the simulator speaks; the scripted model and the engine are the same for all.
DIALECTS = ("vllm", "openai", "anthropic", "gemini")
RUNNERS = ("generate", "pooling")
SCHEDULING_POLICIES = ("fcfs", "priority")

_positive_int = [v.instance_of(int), v.ge(1)]
_non_negative_int = [v.instance_of(int), v.ge(0)]
_non_negative_float = [v.instance_of(float), v.ge(0.0)]


def _as_float(value: float | int) -> float:
    # A TOML or CLI `0` for a seconds field is still a number of seconds; accept ints here only.
    if isinstance(value, bool):
        raise TypeError("expected a number of seconds, got a bool")
    return float(value) if isinstance(value, int) else value


@attrs.frozen(kw_only=True)
class SimConfig:
    """What the simulated `vllm serve` was started with, and how fast its fake GPU is."""

    # Which API the simulator imitates: vLLM's OpenAI-compatible server (the default),
    # OpenAI's own Chat Completions, Anthropic Messages, or Gemini (AI Studio and Vertex AI).
    dialect: str = attrs.field(default="vllm", validator=v.in_(DIALECTS))

    # --served-model-name: the only name requests may use.
    served_model_name: str = attrs.field(default="qwen3-32b", validator=v.instance_of(str))
    # The weights path `vllm serve <model>` was given: shown as `root` in /v1/models only.
    model: str = attrs.field(default="Qwen/Qwen3-32B-FP8", validator=v.instance_of(str))
    # --max-num-seqs: sequences decoded at once; the rest wait in an unbounded FIFO.
    max_num_seqs: int = attrs.field(default=8, validator=_positive_int)
    # --scheduling-policy: "fcfs" serves the waiting queue in arrival order and ignores a
    # request's `priority`; "priority" serves it by (priority, arrival), lower first, and a
    # sequence that needs a KV block when none is free preempts the running one of the largest
    # (priority, arrival) instead of the newest (sched.py).
    scheduling_policy: str = attrs.field(default="fcfs", validator=v.in_(SCHEDULING_POLICIES))
    # --num-gpu-blocks-override: the KV cache in 16-token blocks; 0: room for max_num_seqs
    # sequences of max_model_len (so none is ever preempted).
    num_gpu_blocks_override: int = attrs.field(default=0, validator=_non_negative_int)
    # --max-model-len: prompt + output tokens of one sequence.
    max_model_len: int = attrs.field(default=4096, validator=[*_positive_int, v.ge(2)])
    # anthropic: the model's output cap, what `max_tokens` may be at most (Anthropic refuses
    # more, in its words); 0: max_model_len. Claude models write far less than their context
    # holds (Claude 3.5 Haiku: 8192 of 200K).
    max_output_tokens: int = attrs.field(default=0, validator=_non_negative_int)
    # --api-key: when set, /v1/* needs `Authorization: Bearer <key>`.
    api_key: str | None = attrs.field(
        default=None,
        validator=v.optional(v.instance_of(str)),
        repr=lambda key: "None" if key is None else "<SECRET>",
    )
    # --reasoning-parser qwen3: thinking goes to `reasoning`; off, it stays in `content`.
    reasoning_parser: bool = attrs.field(default=True, validator=v.instance_of(bool))
    # --enable-auto-tool-choice --tool-call-parser hermes: off, `tool_choice: "auto"` is a 400.
    tool_call_parser: bool = attrs.field(default=True, validator=v.instance_of(bool))
    prefill_s_per_token: float = attrs.field(
        default=0.00002, converter=_as_float, validator=_non_negative_float
    )
    decode_step_s: float = attrs.field(
        default=0.004, converter=_as_float, validator=_non_negative_float
    )
    # Added per running sequence: a step slows down as the batch grows, as on a GPU.
    decode_step_s_per_seq: float = attrs.field(
        default=0.0002, converter=_as_float, validator=_non_negative_float
    )
    default_reasoning_tokens: int = attrs.field(default=8, validator=_non_negative_int)
    default_text_tokens: int = attrs.field(default=16, validator=_non_negative_int)
    # Block hashes the prefix cache remembers (16 tokens each), least recently used evicted.
    prefix_cache_blocks: int = attrs.field(default=4096, validator=_non_negative_int)
    # --enable-prompt-tokens-details: usage reports the prompt tokens the prefix cache served,
    # as `prompt_tokens_details.cached_tokens` (always on in the openai dialect).
    enable_prompt_tokens_details: bool = attrs.field(default=False, validator=v.instance_of(bool))
    # Tokens a sequence may run ahead of its client before the engine stops decoding it (the
    # sequence then waits out of the batch until its writer catches up). 0: no bound, vLLM's
    # way: its output collector merges what a slow client has not taken yet, and the engine
    # decodes on, so a slow client costs its full generation until it is dropped.
    client_lead_tokens: int = attrs.field(default=64, validator=_non_negative_int)
    # Real vLLM aborts a request whose client left. False simulates a server that cannot see
    # the disconnect (keeps generating for nobody), to measure what that costs.
    abort_on_disconnect: bool = attrs.field(default=True, validator=v.instance_of(bool))
    # gemini: `POST /token` verifies the signature of JWT grants with this RSA public key
    # (PEM) when set; without it the JWT's shape and claims are still checked.
    oauth_public_key_pem: str | None = attrs.field(
        default=None, validator=v.optional(v.instance_of(str))
    )
    # gemini: `expires_in` of the access tokens `POST /token` grants.
    oauth_token_lifetime_s: int = attrs.field(default=3600, validator=_positive_int)
    # gemini: Vertex AI paths accept only unexpired tokens from `POST /token`. Off: a bearer
    # equal to `api_key` (or anything, without an api_key) works too.
    vertex_require_token: bool = attrs.field(default=False, validator=v.instance_of(bool))
    # Hypercorn's access log (one line per request) is noise in tests and benchmarks.
    access_log: bool = attrs.field(default=False, validator=v.instance_of(bool))
    # vllm: `vllm serve --runner pooling --convert embed`: the model embeds (/v1/embeddings)
    # and no longer generates (chat and completions are 404, as are embeddings under
    # "generate"). The openai dialect serves every endpoint whatever this says.
    runner: str = attrs.field(default="generate", validator=v.in_(RUNNERS))
    # The length of an embedding (the model's hidden size; the tiny Qwen3's is 128).
    embedding_dimensions: int = attrs.field(default=128, validator=_positive_int)
