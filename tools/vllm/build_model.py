"""Build a tiny random-weight Qwen3-architecture model for the real-vLLM test tier.

Run with the vLLM venv's python (see setup.sh); it needs torch, transformers and tokenizers.

    python tools/vllm/build_model.py            # prints the model directory on stdout
    python tools/vllm/build_model.py --force    # rebuild even if the cached copy is complete

What it makes, in ~/.cache/trio-gateway/models/tiny-qwen3-<MODEL_VERSION>/ (or $TRIO_GATEWAY_CACHE):

- a byte-level BPE tokenizer trained here on a small built-in corpus (English, JSON, code,
  Chinese, Japanese, emoji), with Qwen3's added tokens (<|endoftext|>, <|im_start|>,
  <|im_end|>, <tool_call>, </tool_call>, <tool_response>, </tool_response>, <think>, </think>)
  flagged special / not special as Qwen3 does, and Qwen3's pre-tokenizer split pattern;
- a chat template that renders like Qwen3's (ChatML, hermes-style <tool_call> JSON, tool
  results as <tool_response> in a user turn, `enable_thinking=false` pre-fills an empty
  <think></think> block, earlier turns' reasoning dropped);
- a Qwen3ForCausalLM with 2 layers, hidden size 128, 4 query / 2 KV heads of head_dim 32,
  random weights from a fixed seed, bfloat16;
- generation_config.json like Qwen3's (sampling defaults temperature 0.6, top_p 0.95, top_k 20).

The weights are random, so the text is noise, with two deliberate properties that make tests
deterministic (see _shape_logits):

- the model never emits an added token (end of turn, <think>, <tool_call>, ...) by itself: an
  unconstrained generation always runs to max_tokens (finish_reason "length");
- when a structured-outputs regex spells out "<think>", "</think>", "<tool_call>" ..., the model
  writes them as the single added token, never as the characters "<", "think", ">", so vLLM's
  reasoning and tool parsers see real Qwen3-like token streams.

The directory is built in a temporary sibling and renamed into place after a self-check, so an
interrupted build is never mistaken for a complete one. Bump MODEL_VERSION when the recipe
changes.
"""

# ruff: noqa: RUF001  (the corpus has CJK punctuation on purpose)
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sys
import time
from pathlib import Path

# Nothing here may come from a model hub, and progress bars only clutter CI logs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

MODEL_VERSION = "v2"
SEED = 20260101
SERVED_ARCH = "Qwen3ForCausalLM"

# Qwen3's added tokens, with Qwen3's "special" flag (special ones are skipped when decoding
# with skip_special_tokens; the think/tool tags are not, so they survive into the text).
ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
BPE_VOCAB_SIZE = 1000  # before the added tokens
VOCAB_PAD_TO = 64  # the embedding is padded like Qwen3's (151669 tokens, 151936 rows)

# Qwen2/Qwen3's pre-tokenizer split pattern.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Renders like Qwen3's chat template (same output for the same messages); see the file.
CHAT_TEMPLATE_FILE = Path(__file__).with_name("chat_template.jinja")

_CITIES = [
    "paris",
    "london",
    "tokyo",
    "berlin",
    "madrid",
    "rome",
    "new york",
    "sydney",
    "北京",
    "上海",
    "東京",
    "大阪",
]
_CONDITIONS = ["sunny", "cloudy", "rain", "snow", "wind", "fog", "storm", "clear sky"]
_BASE_TEXT = """\
The quick brown fox jumps over the lazy dog. Hello, world! How are you today?
What is the weather in Paris? It is sunny and 21 degrees celsius, with a light wind.
Tomorrow there will be rain in the morning and clouds in the afternoon.
The gateway forwards each request to the model server and streams the answer back.
A request has a model name, a list of messages, a temperature and a maximum number of tokens.
The assistant thinks step by step before it answers the question of the user.
Let me think. The user asks about the weather, so I should call the weather tool first.
I will look up the forecast, then answer in one short sentence.
def get_weather(city: str, unit: str = "celsius") -> dict:
    return {"city": city, "temperature": 21, "unit": unit, "condition": "sunny"}
for i in range(10):
    print(i, i * i)
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"name": "search", "arguments": {"query": "latest news", "limit": 5}}
{"role": "user", "content": "what is the weather in paris"}
{"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function"}]}
{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
You are a helpful assistant. Answer briefly and politely.
今天天气很好，我们去公园散步吧。北京明天有雨，气温十五度。
你好，世界！请问今天的天气怎么样？我想知道上海的温度。
我需要先想一想，然后再回答这个问题。
こんにちは、世界。今日はいい天気ですね。東京は明日雨が降るでしょう。
ありがとうございます。天気予報を調べます。
안녕하세요. 오늘 날씨가 좋네요.
Emoji: 😀 😂 🎉 👍 🚀 ☀️ 🌧️ ❄️ 🌈 🔥 ✅ ❌ 🤔 💡 🐍 🦀
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2048 3.14 -7 1e6
Punctuation: ( ) [ ] { } < > " ' : ; , . ! ? - _ = + * / \\ | @ # $ % ^ & ~ `
"""


def corpus() -> list[str]:
    """A small built-in training corpus: fixed text plus generated weather/tool sentences."""
    lines = _BASE_TEXT.splitlines()
    for i, city in enumerate(_CITIES):
        for j, cond in enumerate(_CONDITIONS):
            t = (i * 7 + j * 3) % 35 - 5
            lines.append(f"The weather in {city} is {cond}, {t} degrees.")
            lines.append(
                json.dumps({"name": "get_weather", "arguments": {"city": city}}, ensure_ascii=False)
            )
            lines.append(f'{{"city": "{city}", "temperature": {t}, "condition": "{cond}"}}')
    lines += ["<think>\nThe user wants the weather.\n</think>\n\nIt is sunny."] * 3
    lines += ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris"}}\n</tool_call>']
    return lines


def build_tokenizer() -> object:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    # add_special_tokens() would flag every token special; add them one by one, in order.
    for text, special in ADDED_TOKENS:
        token = AddedToken(
            text, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False
        )
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    return tok


def _shape_logits(model: object, tokenizer: object, vocab_size: int) -> None:
    """Give the random model a per-token logit offset, so tests are deterministic.

    The embedding gets a constant 1.0 in dimension 0 (other dimensions are N(0, 1)); the tiny
    random layers barely change the residual stream, so after the final RMSNorm dimension 0 is
    ~1.0 for every position and column 0 of lm_head acts as a bias. Offsets: added tokens -20
    (never chosen freely, but chosen when a grammar allows nothing else or prefers the added
    token), ordinary tokens containing "<" -40 (so "<think>" is written as the added token, not
    spelled out), padding rows -60 (never chosen).
    """
    import torch

    added = {text for text, _ in ADDED_TOKENS}
    vocab = tokenizer.get_vocab()  # type: ignore[attr-defined]
    bias = torch.zeros(vocab_size)
    for text, idx in vocab.items():
        if text in added:
            bias[idx] = -20.0
        else:
            piece = tokenizer.convert_tokens_to_string([text])  # type: ignore[attr-defined]
            if "<" in piece:
                bias[idx] = -40.0
    bias[len(vocab) :] = -60.0
    with torch.no_grad():
        emb = model.model.embed_tokens.weight  # type: ignore[attr-defined]
        emb.normal_(0.0, 1.0)
        emb[:, 0] = 1.0
        head = model.lm_head.weight  # type: ignore[attr-defined]
        head[:, 0] = bias


def build(out: Path) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(SEED)
    raw = build_tokenizer()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        model_max_length=40960,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE_FILE.read_text()
    n_tokens = len(tokenizer)
    vocab_size = -(-n_tokens // VOCAB_PAD_TO) * VOCAB_PAD_TO
    ids = {text: tokenizer.convert_tokens_to_ids(text) for text, _ in ADDED_TOKENS}

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        attention_bias=False,
        use_cache=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        architectures=[SERVED_ARCH],
    )
    config.dtype = torch.bfloat16
    model = Qwen3ForCausalLM(config)
    _shape_logits(model, tokenizer, vocab_size)
    model = model.to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
        top_k=20,
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "trio-gateway-model.json").write_text(
        json.dumps(
            {
                "recipe": MODEL_VERSION,
                "seed": SEED,
                "tokens": n_tokens,
                "vocab_size": vocab_size,
                "added_token_ids": ids,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
        )
        + "\n"
    )


def self_check(path: Path) -> None:
    """Reload what was saved, the way vLLM will, and check the properties tests rely on."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.architectures == [SERVED_ARCH], cfg.architectures
    assert cfg.head_dim >= 32 and cfg.vocab_size >= len(tok)
    for text, special in ADDED_TOKENS:
        enc = tok.encode(text, add_special_tokens=False)
        assert len(enc) == 1, (text, enc)
        assert (tok.decode(enc, skip_special_tokens=True) == "") == special, text
    for sample in [
        "hello, what is the weather in paris",
        "你好，世界！今天天气很好",
        "こんにちは 😀🎉 🦀",
        '{"city": "x"}\n<tool_call>\n',
    ]:
        assert tok.decode(tok.encode(sample, add_special_tokens=False)) == sample, sample

    msgs = [{"role": "user", "content": "what is the weather in paris"}]
    off = tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), off
    on = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert on.endswith("<|im_start|>assistant\n"), on
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    history = [
        *msgs,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    rendered = tok.apply_chat_template(
        history, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert "# Tools" in rendered and "<tools>\n{" in rendered, rendered
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris"}}\n</tool_call>'
        in rendered
    ), rendered
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in rendered

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok.apply_chat_template(
        msgs, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]  # (positions, vocab)
    added_ids = [tok.convert_tokens_to_ids(t) for t, _ in ADDED_TOKENS]
    vocab = tok.get_vocab()
    ordinary = [
        i
        for t, i in vocab.items()
        if i not in added_ids and "<" not in tok.convert_tokens_to_string([t])
    ]
    angle = [
        i
        for t, i in vocab.items()
        if i not in added_ids and "<" in tok.convert_tokens_to_string([t])
    ]
    lo_ordinary = logits[:, ordinary].min(dim=1).values
    hi_added = logits[:, added_ids].max(dim=1).values
    lo_added = logits[:, added_ids].min(dim=1).values
    hi_angle = logits[:, angle].max(dim=1).values if angle else lo_added - 1
    assert bool((hi_added < lo_ordinary).all()), "an added token could be sampled freely"
    assert bool((hi_angle < lo_added).all()), "'<' pieces could beat the added tokens"


def model_dir(cache: Path) -> Path:
    return cache / "models" / f"tiny-qwen3-{MODEL_VERSION}"


def default_cache_dir() -> Path:
    return Path(os.environ.get("TRIO_GATEWAY_CACHE", Path.home() / ".cache" / "trio-gateway"))


def ensure_model(cache: Path | None = None, *, force: bool = False) -> Path:
    """Return the model directory, building it first if it is missing (or if force)."""
    final = model_dir(cache or default_cache_dir())
    marker = final / "trio-gateway-model.json"
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and not force:
            print(f"[build-model] cached: {final}", file=sys.stderr)
            return final
        start = time.monotonic()
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            build(tmp)
            self_check(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        size = sum(p.stat().st_size for p in final.iterdir())
        print(
            f"[build-model] built {final} ({size / 1e6:.1f} MB) in "
            f"{time.monotonic() - start:.1f} s",
            file=sys.stderr,
        )
    return final


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="default: $TRIO_GATEWAY_CACHE or ~/.cache/trio-gateway",
    )
    args = ap.parse_args()
    print(ensure_model(args.cache_dir, force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
