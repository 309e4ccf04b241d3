"""Pure text rules: how the simulator splits text into "tokens" and counts a prompt.

There is no real tokenizer here, only a deterministic stand-in that behaves like one where the
gateway can notice: words are tokens (long words are cut), every CJK character and every emoji is
its own token (so multi-byte characters travel in many small deltas), whitespace before a word
rides with it. Joining the tokens of a text always gives the text back.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "BLOCK_TOKENS",
    "REASONING_VOCABULARY",
    "TEXT_VOCABULARY",
    "PromptInfo",
    "count_prompt",
    "is_attached",
    "prompt_info",
    "split_text",
    "stable_seed",
    "vocabulary_tokens",
]

# Long words are cut like a BPE tokenizer would cut them, so a pasted base64 blob counts high.
MAX_WORD_CHARS = 8
# vLLM's prefix cache works on whole KV blocks; 16 tokens is vLLM's default block size.
BLOCK_TOKENS = 16

# Template overhead of the rule documented in docs/simulator.md: 5 tokens per prompt, 4 per
# message, 6 for the empty think block Qwen3's template adds when thinking is off.
_PROMPT_START = ("<|im_start|>", "system\n")
_PROMPT_END = ("<|im_start|>", "assistant", "\n")
_NO_THINK = ("<think>", "\n", "\n", "</think>", "\n", "\n")
_NON_TEXT_PART = "<|media|>"

# Defaults when no script says what to say. Mixed scripts on purpose: 2-, 3- and 4-byte UTF-8.
# fmt: off
REASONING_VOCABULARY = (
    " Let", " me", " think", " about", " the", " question", ".", " The", " user",
    " asks", " about", " weather", " in", " Paris", ",", " so", " I", " should",
    " check", " 天", "气", " first", " hmm", " 🤔",
)
TEXT_VOCABULARY = (
    " The", " weather", " in", " Paris", " is", " sunny", " today", ",", " and",
    " mild", ".", " 晴", "天", " café", " naïve", " über", " Привет", " мир",
    " 世", "界", " 🌍", " —", " ok", " 🎉",
)
# fmt: on


def _is_wide(char: str) -> bool:
    return unicodedata.east_asian_width(char) in ("W", "F")


def _is_word(char: str) -> bool:
    return (char.isalnum() or char == "_") and not _is_wide(char)


def is_attached(char: str) -> bool:
    # Combining marks, zero-width joiners, variation selectors and skin-tone modifiers belong
    # to the character before them: never start a token with one.
    return unicodedata.category(char) in ("Mn", "Me", "Cf", "Sk") and not char.isspace()


def split_text(text: str) -> tuple[str, ...]:
    """Split `text` into tokens; `"".join(split_text(t)) == t` for every `t`."""
    tokens: list[str] = []
    i, n = 0, len(text)
    while i < n:
        start = i
        if text[i].isspace():
            j = i
            while j < n and text[j].isspace():
                j += 1
            if j < n and text[j - 1] == " ":
                # One space before a word is part of that word's token, as in BPE vocabularies.
                if j - 1 > i:
                    tokens.append(text[i : j - 1])
                start, i = j - 1, j
            else:
                tokens.append(text[i:j])
                i = j
                continue
        if _is_word(text[i]):
            letters = 0
            while i < n and letters < MAX_WORD_CHARS and _is_word(text[i]):
                i += 1
                letters += 1
                while i < n and is_attached(text[i]):
                    i += 1
        else:
            i += 1
        # An emoji sequence (ZWJ, modifiers, selectors) stays one token.
        while i < n and (is_attached(text[i]) or text[i - 1] == "\u200d"):
            i += 1
        tokens.append(text[start:i])
    return tuple(tokens)


def stable_seed(value: Any) -> int:
    """A seed that is the same in every process (`hash()` is salted per process)."""
    blob = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "big")


def vocabulary_tokens(vocabulary: Sequence[str], count: int, seed: int) -> tuple[str, ...]:
    """`count` tokens from `vocabulary`, the same ones for the same seed."""
    # A linear congruential walk instead of `random.Random`: cheap, and stable across Pythons.
    state = seed & 0xFFFFFFFFFFFFFFFF
    out: list[str] = []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append(vocabulary[(state >> 33) % len(vocabulary)])
    return tuple(out)


@attrs.frozen(kw_only=True)
class PromptInfo:
    tokens: int
    # Chained hashes of the prompt's full 16-token blocks, for the prefix cache.
    block_hashes: tuple[int, ...]


def _content_pieces(content: Any) -> Iterable[str]:
    if isinstance(content, str):
        yield from split_text(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield from split_text(part["text"])
            else:
                yield _NON_TEXT_PART


def _message_pieces(message: Mapping[str, Any]) -> Iterable[str]:
    yield "<|im_start|>"
    yield str(message.get("role", ""))
    yield "\n"
    yield from _content_pieces(message.get("content"))
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        for call in tool_calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                yield from split_text(str(function.get("name", "")))
                yield from split_text(str(function.get("arguments", "")))
    yield "<|im_end|>"


def count_prompt(
    messages: Sequence[Mapping[str, Any]], tools: Any, *, thinking: bool
) -> PromptInfo:
    """Count a chat prompt with the documented rule and hash its blocks."""
    pieces: list[str] = list(_PROMPT_START)
    if tools:
        pieces.extend(split_text(json.dumps(tools, ensure_ascii=False, sort_keys=True)))
    for message in messages:
        pieces.extend(_message_pieces(message))
    pieces.extend(_PROMPT_END)
    if not thinking:
        pieces.extend(_NO_THINK)
    return prompt_info(pieces)


def prompt_info(pieces: Sequence[object]) -> PromptInfo:
    """A prompt of these tokens (texts, or token ids): its length and its blocks' hashes."""
    # vLLM never serves the last prompt token from cache (it must compute one position), so
    # only blocks made of the first len-1 tokens can hit.
    hashes: list[int] = []
    previous = b""
    full_blocks = (len(pieces) - 1) // BLOCK_TOKENS
    for block in range(full_blocks):
        chunk = "\x00".join(map(str, pieces[block * BLOCK_TOKENS : (block + 1) * BLOCK_TOKENS]))
        previous = hashlib.blake2b(previous + chunk.encode(), digest_size=8).digest()
        hashes.append(int.from_bytes(previous, "big"))
    return PromptInfo(tokens=len(pieces), block_hashes=tuple(hashes))
