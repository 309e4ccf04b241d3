"""Pure planning: a validated request in, the exact tokens the simulated model will produce out.

A test steers the output by putting `<sim>{"steps": [...]}</sim>` in the last user message (the
language is described in docs/simulator.md). Without a script the output is drawn from a small
vocabulary, seeded by a hash of the messages, so the same request always gets the same answer.

The plan is final before the engine sees the request: `max_tokens`, the context limit and
`ignore_eos` are already applied, so the engine only has to count tokens.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias

import attrs

from .config import SimConfig
from .request import ChatRequest
from .text import (
    REASONING_VOCABULARY,
    TEXT_VOCABULARY,
    is_attached,
    split_text,
    stable_seed,
    vocabulary_tokens,
)

__all__ = [
    "Delay",
    "Drop",
    "Fault",
    "Finish",
    "Generation",
    "Reasoning",
    "Script",
    "ScriptError",
    "SplitUtf8",
    "Text",
    "Token",
    "ToolCall",
    "ToolCalls",
    "extract_script",
    "parse_script",
    "plan_generation",
    "split_arguments",
]

FinishReason: TypeAlias = Literal["stop", "length", "tool_calls"]
TokenKind: TypeAlias = Literal["reasoning", "content", "tool_name", "tool_args", "hidden"]

_SCRIPT_RE = re.compile(r"<sim>(.*?)</sim>", re.DOTALL)
# A script is test input, but still input: keep one request from asking for absurd work.
MAX_SCRIPT_STEPS = 1000
MAX_SCRIPT_TOKENS = 1_000_000
MAX_DELAY_S = 3600.0
# The longest argument fragment, in characters (vLLM's hermes parser streams small pieces).
ARGUMENT_PIECE_CHARS = 3
# The most calls one `tool_calls` step holds (the gateway's vLLM dialect takes indices < 128).
MAX_STEP_TOOL_CALLS = 64
# The dialects whose wire can interleave calls' fragments: Chat Completions chunks name each
# fragment's call by `index`. Anthropic's has one content block open at a time, Gemini's sends
# each call whole: there, `interleave` sends the calls one after the other.
INTERLEAVING_DIALECTS = frozenset({"vllm", "openai"})


class ScriptError(ValueError):
    """The `<sim>` script is not valid; answered with a 400 naming the problem."""


# ---- script steps -------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Reasoning:
    text: str | None = None
    tokens: int = 0


@attrs.frozen(kw_only=True)
class Text:
    text: str | None = None
    tokens: int = 0


@attrs.frozen(kw_only=True)
class ToolCall:
    name: str
    arguments: str  # exactly what is streamed: JSON text, or a raw (maybe invalid) string


@attrs.frozen(kw_only=True)
class ToolCalls:
    """Several calls at once; ``interleave``: their fragments alternate (index 0, 1, 0, 1 …),
    as the Chat Completions stream allows and some upstreams send."""

    calls: tuple[ToolCall, ...]
    interleave: bool = False


@attrs.frozen(kw_only=True)
class Fault:
    status: int
    body: Any = None
    retry_after: float | None = None
    # Only the first `times` requests carrying this same script fail (None: all of them).
    times: int | None = None
    # The dialect's name for the error (vLLM/OpenAI `type` or `code`, Anthropic `error.type`,
    # Google `status`), when the status alone does not say it (e.g. `insufficient_quota`).
    error: str | None = None
    # Fail after the tokens before this step were sent: an error inside a 200 stream.
    in_stream: bool = False


@attrs.frozen(kw_only=True)
class Delay:
    seconds: float


@attrs.frozen(kw_only=True)
class Drop:
    pass


@attrs.frozen(kw_only=True)
class Finish:
    reason: FinishReason


@attrs.frozen(kw_only=True)
class VendorFinish:
    """The dialect's own finish reason, sent as is (gemini, anthropic)."""

    reason: str


@attrs.frozen(kw_only=True)
class SplitUtf8:
    pass


Step: TypeAlias = (
    Reasoning
    | Text
    | ToolCall
    | ToolCalls
    | Fault
    | Delay
    | Drop
    | Finish
    | VendorFinish
    | SplitUtf8
)


@attrs.frozen(kw_only=True)
class Script:
    steps: tuple[Step, ...]
    # The script's own text: requests with the same script share a `times` budget.
    key: str


def _int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ScriptError(f"{what} must be an integer in [{low}, {high}], got {value!r}")
    return value


def _number(value: Any, what: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScriptError(f"{what} must be a number, got {value!r}")
    if not (low <= value <= high) or math.isnan(value):
        raise ScriptError(f"{what} must be in [{low}, {high}], got {value!r}")
    return float(value)


def _literal_or_count(step: Mapping[str, Any], literal: str, count: str) -> tuple[str | None, int]:
    if literal in step:
        if not isinstance(step[literal], str):
            raise ScriptError(f"{literal!r} must be a string")
        return step[literal], 0
    return None, _int(step[count], repr(count), 0, MAX_SCRIPT_TOKENS)


def _parse_tool_call(value: Any, what: str = '"tool_call"') -> ToolCall:
    if not isinstance(value, dict) or set(value) - {"name", "arguments"}:
        raise ScriptError(f'{what} must be {{"name": ..., "arguments": ...}}')
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise ScriptError(f"{what}.name must be a non-empty string")
    arguments = value.get("arguments", {})
    if not isinstance(arguments, str):
        # vLLM's hermes parser re-serialises with json.dumps defaults: ", " and ": ".
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(name=name, arguments=arguments)


def _parse_tool_calls(step: Mapping[str, Any]) -> ToolCalls:
    calls = step["tool_calls"]
    if not isinstance(calls, list) or not 1 <= len(calls) <= MAX_STEP_TOOL_CALLS:
        raise ScriptError(f'"tool_calls" must be a list of 1 to {MAX_STEP_TOOL_CALLS} calls')
    interleave = step.get("interleave", False)
    if not isinstance(interleave, bool):
        raise ScriptError('"interleave" must be a boolean')
    parsed = tuple(_parse_tool_call(call, f'"tool_calls[{i}]"') for i, call in enumerate(calls))
    return ToolCalls(calls=parsed, interleave=interleave)


_STEP_KEYS: dict[str, frozenset[str]] = {
    "reasoning": frozenset({"reasoning"}),
    "reasoning_tokens": frozenset({"reasoning_tokens"}),
    "text": frozenset({"text"}),
    "text_tokens": frozenset({"text_tokens"}),
    "tool_call": frozenset({"tool_call"}),
    "tool_calls": frozenset({"tool_calls", "interleave"}),
    "status": frozenset({"status", "body", "retry_after", "times", "error", "in_stream"}),
    "delay_s": frozenset({"delay_s"}),
    "drop": frozenset({"drop"}),
    "finish": frozenset({"finish"}),
    "vendor_finish": frozenset({"vendor_finish"}),
    "split_utf8": frozenset({"split_utf8"}),
}


def _parse_step(step: Any, i: int) -> Step:
    if not isinstance(step, dict):
        raise ScriptError(f"step {i} must be an object")
    kinds = [key for key in _STEP_KEYS if key in step]
    if len(kinds) != 1:
        raise ScriptError(f"step {i} must have exactly one of {sorted(_STEP_KEYS)}")
    kind = kinds[0]
    unknown = set(step) - _STEP_KEYS[kind]
    if unknown:
        raise ScriptError(f"step {i}: unknown keys {sorted(unknown)}")
    if kind in ("reasoning", "reasoning_tokens"):
        text, count = _literal_or_count(step, "reasoning", "reasoning_tokens")
        return Reasoning(text=text, tokens=count)
    if kind in ("text", "text_tokens"):
        text, count = _literal_or_count(step, "text", "text_tokens")
        return Text(text=text, tokens=count)
    if kind == "tool_call":
        return _parse_tool_call(step["tool_call"])
    if kind == "tool_calls":
        return _parse_tool_calls(step)
    if kind == "status":
        retry = step.get("retry_after")
        times = step.get("times")
        error = step.get("error")
        if error is not None and (not isinstance(error, str) or not error):
            raise ScriptError('"error" must be a non-empty string')
        if not isinstance(step.get("in_stream", False), bool):
            raise ScriptError('"in_stream" must be a boolean')
        return Fault(
            status=_int(step["status"], '"status"', 100, 599),
            body=step.get("body"),
            retry_after=None if retry is None else _number(retry, '"retry_after"', 0, 86400),
            times=None if times is None else _int(times, '"times"', 0, 1_000_000),
            error=error,
            in_stream=step.get("in_stream", False),
        )
    if kind == "delay_s":
        return Delay(seconds=_number(step["delay_s"], '"delay_s"', 0, MAX_DELAY_S))
    if kind in ("drop", "split_utf8"):
        if step[kind] is not True:
            raise ScriptError(f'"{kind}" must be true')
        return Drop() if kind == "drop" else SplitUtf8()
    if kind == "vendor_finish":
        vendor = step["vendor_finish"]
        if not isinstance(vendor, str) or not vendor:
            raise ScriptError('"vendor_finish" must be a non-empty string')
        return VendorFinish(reason=vendor)
    reason = step["finish"]
    if reason not in ("stop", "length", "tool_calls"):
        raise ScriptError('"finish" must be "stop", "length" or "tool_calls"')
    return Finish(reason=reason)


def parse_script(text: str) -> Script:
    """Parse the JSON between `<sim>` and `</sim>`."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ScriptError(f"not JSON: {error}") from None
    if not isinstance(data, dict) or set(data) != {"steps"} or not isinstance(data["steps"], list):
        raise ScriptError('a script is {"steps": [...]}')
    if len(data["steps"]) > MAX_SCRIPT_STEPS:
        raise ScriptError(f"at most {MAX_SCRIPT_STEPS} steps")
    steps = tuple(_parse_step(step, i) for i, step in enumerate(data["steps"]))
    seen_output = False
    for step in steps:
        if isinstance(step, Reasoning) and seen_output:
            raise ScriptError("reasoning steps must come before text and tool calls")
        seen_output = seen_output or isinstance(step, Text | ToolCall | ToolCalls)
    return Script(steps=steps, key=text.strip())


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def extract_script(messages: Sequence[Mapping[str, Any]]) -> Script | None:
    """The script of the last user message, if it has one; or of a tool result among the
    messages that end the conversation: a real agent's tool loop (Codex, Claude Code) ends
    when its tool's output says what the model answers next."""
    trailing = True
    for message in reversed(messages):
        if message.get("role") == "tool" and trailing:
            match = _SCRIPT_RE.search(_message_text(message.get("content")))
            if match is not None:
                return parse_script(match.group(1))
            continue
        trailing = False
        if message.get("role") == "user":
            match = _SCRIPT_RE.search(_message_text(message.get("content")))
            return None if match is None else parse_script(match.group(1))
    return None


def split_arguments(arguments: str) -> tuple[str, ...]:
    """Cut tool-call arguments into small fragments. ASCII travels in pieces of up to three
    characters; every other character travels alone, so a fragment boundary sits right before
    and right after each multi-byte character."""
    pieces: list[str] = []
    run = ""
    for char in arguments:
        previous = run or (pieces[-1] if pieces else "")
        if previous and (is_attached(char) or previous[-1] == "\u200d"):
            # A mark, joiner or modifier stays with the character it modifies.
            if run:
                run += char
            else:
                pieces[-1] += char
        elif char.isascii():
            if len(run) == ARGUMENT_PIECE_CHARS:
                pieces.append(run)
                run = ""
            run += char
        else:
            if run:
                pieces.append(run)
                run = ""
            pieces.append(char)
    if run:
        pieces.append(run)
    return tuple(pieces)


# ---- the plan -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Token:
    """One generated token and what it shows the client (`hidden`: nothing, e.g. EOS)."""

    kind: TokenKind
    text: str = ""  # reasoning/content text, the tool name, or an argument fragment
    tool_index: int = 0
    delay_s: float = 0.0  # the sequence pauses this long before generating this token


@attrs.frozen(kw_only=True)
class Generation:
    tokens: tuple[Token, ...]
    finish_reason: FinishReason
    # Close the connection, without a proper end, once this many tokens were sent.
    drop_after: int | None = None
    # Write each SSE event holding a multi-byte character in two pieces cut inside it.
    split_utf8: bool = False
    fault: Fault | None = None
    # Seconds to wait before answering `fault`, or before sending `stream_fault`.
    fault_delay_s: float = 0.0
    # An in-stream fault: sent once `fault_after` tokens were sent, then the answer ends.
    stream_fault: Fault | None = None
    fault_after: int | None = None
    script_key: str | None = None
    tool_calls: int = 0
    # The dialect's own finish reason in place of the one `finish_reason` maps to (a script's
    # `vendor_finish`: Gemini's MALFORMED_FUNCTION_CALL, Anthropic's refusal, ...).
    vendor_finish: str | None = None

    @property
    def stop_after(self) -> int | None:
        """Tokens to send before the answer is cut short (drop or in-stream fault), if it is."""
        cuts = [n for n in (self.drop_after, self.fault_after) if n is not None]
        return min(cuts) if cuts else None


@attrs.define
class _Builder:
    """Accumulates tokens; a pending delay lands on whichever token comes next."""

    tokens: list[Token] = attrs.Factory(list)
    pending_delay: float = 0.0

    def add(self, kind: TokenKind, text: str = "", tool_index: int = 0) -> None:
        self.tokens.append(
            Token(kind=kind, text=text, tool_index=tool_index, delay_s=self.pending_delay)
        )
        self.pending_delay = 0.0

    def add_text(self, kind: TokenKind, pieces: Sequence[str]) -> None:
        for piece in pieces:
            self.add(kind, piece)


def _default_script(config: SimConfig) -> Script:
    return Script(
        steps=(
            Reasoning(tokens=config.default_reasoning_tokens),
            Text(tokens=config.default_text_tokens),
        ),
        key="",
    )


def _tool_call_tokens(call: ToolCall, index: int, request: ChatRequest) -> list[Token]:
    """A parsed call's tokens: its name, its argument pieces, the markup the parser swallows."""
    # parallel_tool_calls=false: vLLM generates every call and returns only the first.
    shown = index == 0 or request.parallel_tool_calls
    name: TokenKind = "tool_name" if shown else "hidden"
    args: TokenKind = "tool_args" if shown else "hidden"
    return [
        Token(kind=name, text=call.name, tool_index=index),
        *(
            Token(kind=args, text=piece, tool_index=index)
            for piece in split_arguments(call.arguments)
        ),
        Token(kind="hidden", text="}\n</tool_call>", tool_index=index),
    ]


def _add_tool_calls(
    out: _Builder, calls: Sequence[ToolCall], first: int, request: ChatRequest, *, interleave: bool
) -> None:
    """Calls numbered from ``first``: one after the other, or (``interleave``) a token of each
    in turn, each call's own tokens in their order."""
    if not request.parse_tools:
        # No parser for this request: the hermes markup reaches the client as plain content.
        for index, call in enumerate(calls, first):
            if index > 0:
                out.add("content", "\n")
            out.add_text(
                "content", ("<tool_call>", "\n", *split_text(f'{{"name": "{call.name}", '))
            )
            pieces = split_arguments(call.arguments)
            out.add_text(
                "content", (*split_text('"arguments": '), *pieces, "}", "\n", "</tool_call>")
            )
        return
    queues = [_tool_call_tokens(call, index, request) for index, call in enumerate(calls, first)]
    if not interleave:
        queues = [[token for queue in queues for token in queue]]
    for turn in range(max(len(queue) for queue in queues)):
        for queue in queues:
            if turn < len(queue):
                token = queue[turn]
                out.add(token.kind, token.text, token.tool_index)


def plan_generation(request: ChatRequest, config: SimConfig) -> Generation:
    """Decide every token of the answer. Raises `ScriptError` for a bad script."""
    script = extract_script(request.messages) or _default_script(config)
    seed = stable_seed(request.messages)
    steps = script.steps
    reasoning_steps = [s for s in steps if isinstance(s, Reasoning)]
    think = request.thinking and bool(reasoning_steps)
    reasoning_kind: TokenKind = "reasoning" if config.reasoning_parser else "content"
    tag_kind: TokenKind = "hidden" if config.reasoning_parser else "content"

    out = _Builder()
    fault: Fault | None = None
    stream_fault: Fault | None = None
    fault_after: int | None = None
    fault_delay = 0.0
    drop_after: int | None = None
    finish: FinishReason | None = None
    vendor_finish: str | None = None
    split_utf8 = False
    tool_calls = 0
    think_open = False

    def close_think() -> None:
        nonlocal think_open
        if think_open:
            out.add(tag_kind, "</think>")
            if request.blank_after_think:
                out.add("content", "\n\n")  # Qwen3 writes a blank line after its thinking
            think_open = False

    if think:
        out.add(tag_kind, "<think>")
        think_open = True
    for step in steps:
        if isinstance(step, Reasoning):
            if not request.thinking:
                continue  # thinking is off for this request: the script's thoughts vanish
            pieces = (
                split_text(step.text)
                if step.text is not None
                else vocabulary_tokens(REASONING_VOCABULARY, step.tokens, seed)
            )
            out.add_text(reasoning_kind, pieces)
        elif isinstance(step, Text):
            close_think()
            pieces = (
                split_text(step.text)
                if step.text is not None
                else vocabulary_tokens(TEXT_VOCABULARY, step.tokens, seed + 1)
            )
            out.add_text("content", pieces)
        elif isinstance(step, ToolCall | ToolCalls):
            close_think()
            calls = (step,) if isinstance(step, ToolCall) else step.calls
            interleave = isinstance(step, ToolCalls) and step.interleave
            interleave = interleave and config.dialect in INTERLEAVING_DIALECTS
            _add_tool_calls(out, calls, tool_calls, request, interleave=interleave)
            tool_calls += len(calls)
        elif isinstance(step, Fault) and step.in_stream:
            if fault is None:
                # Nothing after an in-stream error is ever sent: the script ends here.
                stream_fault, fault_after = step, len(out.tokens)
                fault_delay = out.pending_delay
                break
        elif isinstance(step, Fault):
            if fault is None:
                fault, fault_delay = step, out.pending_delay
        elif isinstance(step, Delay):
            out.pending_delay += step.seconds
        elif isinstance(step, Drop):
            if drop_after is None:
                drop_after = len(out.tokens)
        elif isinstance(step, Finish):
            finish = step.reason
        elif isinstance(step, VendorFinish):
            vendor_finish = step.reason
        else:
            split_utf8 = True
    if think_open:
        # The thinking ended the answer: the closing tag still costs a token.
        out.add(tag_kind, "</think>")

    natural: FinishReason = "tool_calls" if tool_calls and request.parse_tools else "stop"
    finish = finish or natural
    if finish != "length" or not out.tokens:
        out.add("hidden", "")  # the EOS token: generated, counted, never shown
    tokens = out.tokens
    limit = request.max_tokens
    if request.ignore_eos:
        # Benchmarks ask for exactly max_tokens: keep generating past the end of the script.
        if tokens[-1].kind == "hidden" and not tokens[-1].text:
            tokens.pop()
        missing = max(0, limit - len(tokens))
        tokens.extend(
            Token(kind="content", text=t)
            for t in vocabulary_tokens(TEXT_VOCABULARY, missing, seed + 2)
        )
    if len(tokens) >= limit and (request.ignore_eos or len(tokens) > limit):
        del tokens[limit:]
        finish = "length"
    if drop_after is not None and drop_after >= len(tokens):
        drop_after = None  # the answer ends before the drop point: nothing to drop
    if fault_after is not None and fault_after >= len(tokens):
        stream_fault = fault_after = None  # cut by max_tokens before the error
    return Generation(
        tokens=tuple(tokens),
        finish_reason=finish,
        drop_after=drop_after,
        split_utf8=split_utf8,
        fault=fault,
        fault_delay_s=fault_delay,
        stream_fault=stream_fault,
        fault_after=fault_after,
        script_key=script.key or None,
        tool_calls=tool_calls,
        vendor_finish=vendor_finish,
    )
