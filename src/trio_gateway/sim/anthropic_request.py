"""The simulated Messages API's request checks: what Anthropic refuses, in its own words."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

from .config import SimConfig
from .errors import ApiError
from .request import ChatRequest
from .text import count_prompt
from .vendor_models import anthropic_refusal

MIN_THINKING_BUDGET = 1024


_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"


_FIELDS = frozenset(
    {
        "model", "messages", "max_tokens", "system", "stream", "temperature", "top_p", "top_k",
        "stop_sequences", "tools", "tool_choice", "thinking", "metadata", "service_tier",
        "context_management",
    }
)  # fmt: skip


_BLOCK_KEYS: Mapping[str, frozenset[str]] = {
    "text": frozenset({"type", "text", "cache_control", "citations"}),
    "image": frozenset({"type", "source", "cache_control"}),
    "document": frozenset({"type", "source", "title", "context", "citations", "cache_control"}),
    "tool_use": frozenset({"type", "id", "name", "input", "cache_control"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
    "redacted_thinking": frozenset({"type", "data"}),
}


_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


_TOOL_KEYS = frozenset({"name", "description", "input_schema", "cache_control", "type"})


_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")


# Anthropic's `error.type` for each status a script may fail with.
ERROR_TYPES: Mapping[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Bad request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use this resource."),
    404: ("not_found_error", "Not found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}


class _Invalid(Exception):
    """A 400 found deep in the body; carries Anthropic's message."""


def thinking_signature(thinking: str) -> str:
    """The simulated model's signature of a thinking block: opaque to clients, derived from
    the text so it is stable and pure, and checked when the block comes back."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest() * 2).decode()


def anthropic_error(
    status: int, type_: str, message: str, headers: tuple[tuple[str, str], ...] = ()
) -> ApiError:
    # The handler adds `request_id` (random, so not made here).
    body = {"type": "error", "error": {"type": type_, "message": message}}
    return ApiError(status=status, body=body, headers=headers)


@attrs.frozen(kw_only=True)
class MessagesRequest:
    chat: ChatRequest
    model: str


def _extra(path: str, data: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for key in data:
        if key not in allowed:
            raise _Invalid(f"{path}{key}: Extra inputs are not permitted")


def _text_of(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    if isinstance(blocks, list):
        return "".join(
            b["text"] for b in blocks if isinstance(b, Mapping) and isinstance(b.get("text"), str)
        )
    return ""


def _check_source(block: Mapping[str, Any], path: str) -> None:
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise _Invalid(f"{path}.source: Field required")
    kind = source.get("type")
    if kind == "base64":
        _extra(f"{path}.source.base64.", source, frozenset({"type", "media_type", "data"}))
        if block["type"] == "image" and source.get("media_type") not in _MEDIA_TYPES:
            allowed = ", ".join(repr(m) for m in _MEDIA_TYPES)
            raise _Invalid(f"{path}.source.base64.media_type: Input should be {allowed}")
        if not isinstance(source.get("data"), str):
            raise _Invalid(f"{path}.source.base64.data: Field required")
    elif kind == "url":
        _extra(f"{path}.source.url.", source, frozenset({"type", "url"}))
        if not isinstance(source.get("url"), str):
            raise _Invalid(f"{path}.source.url.url: Field required")
    elif kind not in ("text", "content", "file"):
        raise _Invalid(f"{path}.source: Input tag {kind!r} found using 'type' does not match")


def _check_block(block: Any, path: str, role: str) -> Mapping[str, Any]:
    if not isinstance(block, Mapping):
        raise _Invalid(f"{path}: Input should be a valid dictionary or object")
    kind = block.get("type")
    if not isinstance(kind, str) or kind not in _BLOCK_KEYS:
        tags = ", ".join(f"'{t}'" for t in _BLOCK_KEYS)
        raise _Invalid(
            f"{path}: Input tag '{kind}' found using 'type' does not match any of the "
            f"expected tags: {tags}"
        )
    _extra(f"{path}.{kind}.", block, _BLOCK_KEYS[kind])
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise _Invalid(f"{path}.text.text: Field required")
        if not block["text"]:
            raise _Invalid("messages: text content blocks must be non-empty")
    elif kind in ("image", "document"):
        _check_source(block, path)
    elif kind == "tool_use":
        if role != "assistant":
            raise _Invalid(f"{path}: tool_use blocks are only allowed in assistant messages")
        if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
            raise _Invalid(f"{path}.tool_use.id: Field required")
        if not isinstance(block.get("input"), Mapping):
            raise _Invalid(f"{path}.tool_use.input: Input should be a valid dictionary")
    elif kind == "tool_result":
        if role != "user":
            raise _Invalid(f"{path}: tool_result blocks are only allowed in user messages")
        if not isinstance(block.get("tool_use_id"), str):
            raise _Invalid(f"{path}.tool_result.tool_use_id: Field required")
        content = block.get("content")
        if isinstance(content, list):
            for j, inner in enumerate(content):
                _check_block(inner, f"{path}.tool_result.content.{j}", role)
    elif kind in ("thinking", "redacted_thinking") and role != "assistant":
        raise _Invalid(f"{path}: {kind} blocks are only allowed in assistant messages")
    elif kind == "thinking":
        for key in ("thinking", "signature"):
            if not isinstance(block.get(key), str):
                raise _Invalid(f"{path}.thinking.{key}: Field required")
        # Anthropic checks that the block is the model's, as it sent it.
        if block["signature"] != thinking_signature(block["thinking"]):
            raise _Invalid(f"{path}: Invalid `signature` in `thinking` block")
    elif kind == "redacted_thinking" and not isinstance(block.get("data"), str):
        raise _Invalid(f"{path}.redacted_thinking.data: Field required")
    return block


def _normalise(message: Mapping[str, Any], blocks: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One message in chat-completion shape, for the script and the prompt count."""
    role = message["role"]
    if blocks and all(b["type"] == "tool_result" for b in blocks):
        return {"role": "tool", "content": "".join(_text_of(b.get("content")) for b in blocks)}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "tool_use":
            arguments = json.dumps(block["input"], ensure_ascii=False)
            calls.append({"function": {"name": block["name"], "arguments": arguments}})
        elif kind == "tool_result":
            parts.append({"type": "text", "text": _text_of(block.get("content"))})
        elif kind in ("image", "document"):
            parts.append({"type": kind})
        # Earlier turns' thinking is not part of the context the model sees.
    out: dict[str, Any] = {"role": role, "content": parts}
    if calls:
        out["tool_calls"] = calls
    return out


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise _Invalid("messages: Input should be a valid list")
    if not messages:
        raise _Invalid("messages: at least one message is required")
    normalised: list[dict[str, Any]] = []
    pending_tool_uses: set[str] = set()
    for i, message in enumerate(messages):
        path = f"messages.{i}"
        if not isinstance(message, Mapping):
            raise _Invalid(f"{path}: Input should be a valid dictionary")
        _extra(f"{path}.", message, frozenset({"role", "content"}))
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _Invalid(f"{path}.role: Input should be 'user' or 'assistant'")
        if i == 0 and role != "user":
            raise _Invalid('messages: first message must use the "user" role')
        if i > 0 and messages[i - 1].get("role") == role:
            raise _Invalid(
                'messages: roles must alternate between "user" and "assistant", but found '
                f'multiple "{role}" roles in a row'
            )
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}] if content else []
        elif not isinstance(content, list):
            raise _Invalid(f"{path}.content: Field required")
        last = i == len(messages) - 1
        if not content and not (last and role == "assistant"):
            raise _Invalid(
                f"{path}: all messages must have non-empty content except for the optional "
                "final assistant message"
            )
        blocks = [_check_block(b, f"{path}.content.{j}", role) for j, b in enumerate(content)]
        results = {b["tool_use_id"] for b in blocks if b["type"] == "tool_result"}
        if results - pending_tool_uses:
            unexpected = ", ".join(sorted(results - pending_tool_uses))
            raise _Invalid(
                f"{path}.content.0: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{unexpected}. Each `tool_result` block must have a corresponding `tool_use` "
                "block in the previous message."
            )
        if pending_tool_uses - results:
            missing = ", ".join(sorted(pending_tool_uses - results))
            raise _Invalid(
                f"{path}: `tool_use` ids were found without `tool_result` blocks immediately "
                f"after: {missing}. Each `tool_use` block must have a corresponding "
                "`tool_result` block in the next message."
            )
        pending_tool_uses = {b["id"] for b in blocks if b["type"] == "tool_use"}
        normalised.append(_normalise(message, blocks))
    return normalised


def _check_tools(tools: Any) -> list[Mapping[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _Invalid("tools: Input should be a valid list")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        path = f"tools.{i}.custom."
        if not isinstance(tool, Mapping):
            raise _Invalid(f"tools.{i}: Input should be a valid dictionary")
        _extra(path, tool, _TOOL_KEYS)
        if tool.get("type", "custom") != "custom":
            raise _Invalid(f"tools.{i}: Input tag '{tool.get('type')}' does not match 'custom'")
        name = tool.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise _Invalid(f"{path}name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
        schema = tool.get("input_schema")
        if not isinstance(schema, Mapping):
            raise _Invalid(f"{path}input_schema: Field required")
        if schema.get("type") != "object":
            raise _Invalid(f"{path}input_schema.type: Input should be 'object'")
        if name in names:
            raise _Invalid("tools: Tool names must be unique.")
        names.add(name)
    return tools


def _check_tool_choice(choice: Any, tools: list[Mapping[str, Any]]) -> tuple[str, bool]:
    """The choice's type and whether parallel tool use is allowed."""
    if choice is None:
        return "auto", True
    if not isinstance(choice, Mapping) or choice.get("type") not in ("auto", "any", "none", "tool"):
        raise _Invalid(
            "tool_choice: Input tag found using 'type' does not match any of the expected tags: "
            "'auto', 'any', 'tool', 'none'"
        )
    kind = choice["type"]
    allowed = {"type", "disable_parallel_tool_use"} if kind != "none" else {"type"}
    if kind == "tool":
        allowed.add("name")
        if choice.get("name") not in {t["name"] for t in tools}:
            raise _Invalid(f"Tool '{choice.get('name')}' not found in provided tools")
    _extra(f"tool_choice.{kind}.", choice, frozenset(allowed))
    disable = choice.get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool):
        raise _Invalid(f"tool_choice.{kind}.disable_parallel_tool_use: Input should be a bool")
    return kind, not disable


def _check_thinking(data: Mapping[str, Any], max_tokens: int, choice: str) -> bool:
    thinking = data.get("thinking")
    if thinking is None:
        return False
    kind = thinking.get("type") if isinstance(thinking, Mapping) else None
    if kind == "disabled":
        _extra("thinking.disabled.", thinking, frozenset({"type"}))
        return False
    if kind == "adaptive":
        _extra("thinking.adaptive.", thinking, frozenset({"type"}))
    elif kind == "enabled":
        _extra("thinking.enabled.", thinking, frozenset({"type", "budget_tokens"}))
        budget = thinking.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise _Invalid("thinking.enabled.budget_tokens: Field required")
        if budget < MIN_THINKING_BUDGET:
            raise _Invalid(
                "thinking.enabled.budget_tokens: Input should be greater than or equal to "
                f"{MIN_THINKING_BUDGET}"
            )
        if budget >= max_tokens:
            raise _Invalid(
                "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult "
                f"our documentation at {_DOCS}#max-tokens-and-context-window-size"
            )
    else:
        raise _Invalid(
            "thinking: Input tag found using 'type' does not match any of the expected tags: "
            "'enabled', 'disabled', 'adaptive'"
        )
    if data.get("temperature") not in (None, 1, 1.0):
        raise _Invalid(
            "`temperature` may only be set to 1 when thinking is enabled. Please consult our "
            f"documentation at {_DOCS}#important-considerations-when-using-extended-thinking"
        )
    if data.get("top_k") is not None:
        raise _Invalid("`top_k` must be unset when thinking is enabled.")
    if choice in ("any", "tool"):
        raise _Invalid("Thinking may not be enabled when `tool_choice` forces tool use.")
    return True


def _check_tool_loop_thinking(messages: list[Any]) -> None:
    """With thinking on, the assistant turn whose tool calls the last message answers must open
    with its thinking (Anthropic's rule, in its words): a tool loop thinks on only with the
    model's own signed thinking sent back."""
    last = messages[-1]
    if last.get("role") != "user" or not isinstance(last.get("content"), list):
        return
    if not any(b.get("type") == "tool_result" for b in last["content"]):
        return
    i = len(messages) - 2
    content = messages[i].get("content") if i >= 0 else None
    if not isinstance(content, list) or not content:
        return
    found = content[0].get("type")
    if found in ("thinking", "redacted_thinking"):
        return
    raise _Invalid(
        f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
        f"`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
        "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). "
        "We recommend you include thinking blocks from previous turns. To avoid this "
        f"requirement, disable `thinking`. Please consult our documentation at {_DOCS}"
    )


def _check_system(system: Any) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    if not isinstance(system, list):
        raise _Invalid("system: Input should be a valid string or list")
    for i, block in enumerate(system):
        if not isinstance(block, Mapping) or block.get("type") != "text":
            raise _Invalid(f"system.{i}: Input should be a text block")
        _check_block(block, f"system.{i}", "user")
    return _text_of(system)


def _check_stop_sequences(stops: Any) -> None:
    if stops is None:
        return
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _Invalid("stop_sequences: Input should be a valid list")
    for stop in stops:
        # Anthropic's words for each, as its API answers them.
        if not stop:
            raise _Invalid("stop_sequences: each stop sequence must be non-empty")
        if not stop.strip():
            raise _Invalid("stop_sequences: each stop sequence must contain non-whitespace")


def _int_field(data: Mapping[str, Any], name: str) -> int:
    value = data.get(name)
    if value is None:
        raise _Invalid(f"{name}: Field required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"{name}: Input should be a valid integer")
    return value


# Anthropic's context editing strategies (context-management-2025-06-27).
_CLEAR_THINKING = "clear_thinking_20251015"
_EDITS = (_CLEAR_THINKING, "clear_tool_uses_20250919")


def _check_context_management(value: Any, thinking: bool) -> None:
    """As Anthropic checks it: ``{"edits": [...]}``, each edit a known strategy; clearing
    thinking needs thinking on, and comes first when strategies are combined."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise _Invalid("context_management: Input should be an object")
    _extra("context_management.", value, frozenset({"edits"}))
    edits = value.get("edits")
    if not isinstance(edits, list):
        raise _Invalid("context_management.edits: Input should be a valid list")
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind not in _EDITS:
            expected = " or ".join(repr(e) for e in _EDITS)
            raise _Invalid(f"context_management.edits.{i}.type: Input should be {expected}")
        if kind == _CLEAR_THINKING and not thinking:
            raise _Invalid(
                f"context_management.edits.{i}: {_CLEAR_THINKING} requires thinking to be enabled"
            )
        if kind == _CLEAR_THINKING and i > 0:
            raise _Invalid(f"context_management.edits: {_CLEAR_THINKING} must come first")


def _validate(data: Mapping[str, Any], config: SimConfig) -> MessagesRequest | ApiError:
    _extra("", data, _FIELDS)
    model = data.get("model")
    if not isinstance(model, str):
        raise _Invalid("model: Field required")
    max_tokens = _int_field(data, "max_tokens")
    if max_tokens < 1:
        raise _Invalid("max_tokens: Input should be greater than or equal to 1")
    if "stream" in data and not isinstance(data["stream"], bool):
        raise _Invalid("stream: Input should be a valid boolean")
    _check_stop_sequences(data.get("stop_sequences"))
    messages = _check_messages(data.get("messages"))
    system = _check_system(data.get("system"))
    tools = _check_tools(data.get("tools"))
    choice, parallel = _check_tool_choice(data.get("tool_choice"), tools)
    thinking = _check_thinking(data, max_tokens, choice)
    if thinking:
        _check_tool_loop_thinking(data["messages"])
    _check_context_management(data.get("context_management"), thinking)
    if model != config.served_model_name:
        return anthropic_error(404, "not_found_error", f"model: {model}")
    if (refusal := anthropic_refusal(model, data)) is not None:
        raise _Invalid(refusal)
    output_cap = config.max_output_tokens or config.max_model_len
    if max_tokens > output_cap:
        raise _Invalid(
            f"max_tokens: {max_tokens} > {output_cap}, which is the maximum allowed "
            f"number of output tokens for {model}"
        )
    if system:
        messages.insert(0, {"role": "system", "content": system})
    prompt = count_prompt(messages, tools or None, thinking=True)
    if prompt.tokens >= config.max_model_len:
        raise _Invalid(
            f"prompt is too long: {prompt.tokens} tokens > {config.max_model_len} maximum"
        )
    chat = ChatRequest(
        messages=tuple(messages),
        stream=bool(data.get("stream")),
        include_usage=False,
        continuous_usage=False,
        max_tokens=min(max_tokens, config.max_model_len - prompt.tokens),
        ignore_eos=False,
        thinking=thinking,
        parse_tools=bool(tools) and choice != "none",
        parallel_tool_calls=parallel,
        prompt=prompt,
        blank_after_think=False,
    )
    return MessagesRequest(chat=chat, model=model)


def parse_messages_request(
    body: bytes, config: SimConfig, *, version: bytes | None
) -> MessagesRequest | ApiError:
    """Check a `POST /v1/messages` (its `anthropic-version` header, then its body)."""
    if not version:
        return anthropic_error(
            400, "invalid_request_error", "anthropic-version: header is required"
        )
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return anthropic_error(400, "invalid_request_error", "There was an error parsing the body")
    if not isinstance(data, dict):
        return anthropic_error(400, "invalid_request_error", "Input should be an object")
    try:
        return _validate(data, config)
    except _Invalid as problem:
        return anthropic_error(400, "invalid_request_error", str(problem))
