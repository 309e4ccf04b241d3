from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_gateway.sim.text import BLOCK_TOKENS, count_prompt, split_text, vocabulary_tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", ()),
        ("Hello 世界 🌍", ("Hello", " 世", "界", " 🌍")),
        ("hello, what is", ("hello", ",", " what", " is")),
        ("a\n\nb", ("a", "\n\n", "b")),
        ("a  b", ("a", " ", " b")),
        ("end ", ("end", " ")),
        ("internationalization", ("internat", "ionaliza", "tion")),
        ("café naïve", ("café", " naïve")),
        ("cafe\u0301", ("cafe\u0301",)),  # a combining accent stays with its letter
        ("👍🏽!", ("👍🏽", "!")),  # skin-tone modifier stays with its emoji
        ("👨\u200d👩\u200d👧 ok", ("👨\u200d👩\u200d👧", " ok")),  # one ZWJ family
        ('{"city": "x"}', ("{", '"', "city", '"', ":", ' "', "x", '"', "}")),
    ],
)
def test_split_text(text: str, tokens: tuple[str, ...]) -> None:
    assert split_text(text) == tokens


@given(st.text())
def test_split_text_gives_the_text_back(text: str) -> None:
    tokens = split_text(text)
    assert "".join(tokens) == text
    assert all(tokens)


def test_prompt_count_rule_matches_the_fixtures_for_the_paris_question() -> None:
    # Real vLLM counted 17 tokens with thinking on and 23 with it off (a_nonstream_*.json);
    # the documented rule happens to agree: 5 + (4 + 8 words) [+ 6].
    messages = [{"role": "user", "content": "hello, what is the weather in paris"}]
    assert count_prompt(messages, None, thinking=True).tokens == 17
    assert count_prompt(messages, None, thinking=False).tokens == 23


def test_prompt_count_covers_content_parts_tools_and_tool_calls() -> None:
    base = count_prompt([{"role": "user", "content": "one two"}], None, thinking=True).tokens
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": " two"}]
    assert count_prompt([{"role": "user", "content": parts}], None, thinking=True).tokens == base
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    with_tools = count_prompt([{"role": "user", "content": "one two"}], tools, thinking=True)
    assert with_tools.tokens > base
    call = {"function": {"name": "f", "arguments": '{"a": 1}'}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert count_prompt([assistant], None, thinking=True).tokens > 5 + 4


def test_block_hashes_share_a_common_prefix_only() -> None:
    common = " ".join(f"w{i}" for i in range(100))
    a = count_prompt([{"role": "user", "content": common + " a" * 50}], None, thinking=True)
    b = count_prompt([{"role": "user", "content": common + " b" * 50}], None, thinking=True)
    assert len(a.block_hashes) == (a.tokens - 1) // BLOCK_TOKENS
    assert a.tokens == b.tokens
    shared = [x == y for x, y in zip(a.block_hashes, b.block_hashes, strict=True)]
    # The first 100 words plus 7 template tokens fill 6 whole blocks; everything after differs.
    assert shared == [True] * 6 + [False] * (len(shared) - 6)


def test_vocabulary_tokens_are_deterministic_and_seeded() -> None:
    vocab = ("a", "b", "c", "d")
    assert vocabulary_tokens(vocab, 10, 1) == vocabulary_tokens(vocab, 10, 1)
    assert vocabulary_tokens(vocab, 10, 1) != vocabulary_tokens(vocab, 10, 2)
    assert len(vocabulary_tokens(vocab, 2000, 7)) == 2000
