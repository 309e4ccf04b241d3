"""An Anthropic Messages body → the gateway's chat body. Pure.

The Messages front (``POST /v1/messages``) checks the body by Anthropic's rules, in Anthropic's
words (``max_tokens: Field required``), and builds the OpenAI chat body every provider takes,
which ``core/request.validate_chat_body`` then validates as any chat body. The mapping (each
row also in docs/api.md, "Anthropic Messages"):

=========================  =====================================================================
``model``                  ``model`` (an alias)
``system`` (text, blocks)  a ``system`` message first (blocks: text parts)
``messages``               user text/image blocks → a user message; ``tool_result`` blocks →
                           ``tool`` messages (before the user's other blocks, as Anthropic
                           orders them; images in a result follow as a user message);
                           assistant text → ``content``, ``tool_use`` → ``tool_calls``,
                           ``thinking`` / ``redacted_thinking`` → ``reasoning_details``
``max_tokens`` (required)  ``max_tokens`` (providers clamp it to the model's output cap)
``stop_sequences``         ``stop``
``temperature``, ``top_p`` as is; ``top_k`` as vLLM's ``top_k``
``metadata.user_id``       ``user``; a Claude Code user id's ``session_id`` is the session
``tools``                  function tools (``input_schema`` → ``parameters``); server tools
                           (``web_search_...``, ``bash_...``) dropped, or refused, as the
                           alias's ``builtin_tools`` says
``tool_choice``            auto → ``auto``, any → ``required``, tool → the named function,
                           none → ``none``; ``disable_parallel_tool_use`` →
                           ``parallel_tool_calls: false``
``thinking``               enabled → ``reasoning_effort`` from ``budget_tokens``; adaptive →
                           reasoning on (``output_config.effort`` its effort); disabled → off;
                           absent → the alias's ``messages_without_thinking``: nothing said
                           (the model's default), or off (and no effort). Without thinking
                           enabled, the answer shows none (:attr:`Translated.thinking`)
``output_config``          ``effort`` → ``reasoning_effort``; ``format`` (json_schema) →
                           ``response_format``
``stream``                 ``stream`` (the upstream is always asked for usage)
``cache_control``,         kept for an Anthropic provider (``messages_extras.py``), which
``context_management``,    alone gets them
``service_tier``,
``anthropic-beta``
anything else              dropped, each named in :attr:`Translated.dropped` (logged, counted)
=========================  =====================================================================
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from trio_gateway.config.schema import BuiltinTools, MessagesWithoutThinking
from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.reasoning_details import ANTHROPIC, ENCRYPTED, TEXT
from trio_gateway.core.request import ANTHROPIC_EXTRAS
from trio_gateway.fronts.messages.events import decode_signature
from trio_gateway.fronts.messages.extras import (
    SERVER_TOOL_TYPES,
    Extras,
    block_breakpoint,
    keep_fields,
    kept_fields,
)

Json = dict[str, Any]

FRONT: Final = "messages"
# "system" in the list: Claude Code (2.1.3xx) sends its environment as a system message after
# the user's first one, and sends the request again without it when that is refused.
ROLES: Final = ("user", "assistant", "system")
# Top-level fields dropped by name (the counter's label): Anthropic's own, which no provider
# behind the chat shape can honour. Any other unknown field is counted as "other".
KNOWN_DROPPED: Final = frozenset(
    {
        "context_management",
        "service_tier",
        "container",
        "mcp_servers",
        "inference_geo",
        "speed",
        "betas",
    }
)
OTHER_FIELD: Final = "other"
TRANSLATED: Final = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "stream",
    }
)
# output_config.effort → reasoning_effort ("max" is above OpenAI's scale's top).
EFFORTS: Final = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
    "max": "xhigh",
}
# thinking.budget_tokens → the effort whose budget (providers/translate.EFFORT_BUDGET_TOKENS:
# low 2048, medium 8192, high 16384, xhigh 32768) is nearest, geometrically.
BUDGET_EFFORTS: Final = ((3_000, "low"), (12_000, "medium"), (24_000, "high"))
MIN_THINKING_BUDGET: Final = 1024
# Where its messages and their parts are (core/body.py bounds them): the system blocks, the
# messages, their blocks, and the blocks of a tool result.
MESSAGES_PARTS: Final = (
    ("system",),
    ("messages",),
    ("messages", "*", "content"),
    ("messages", "*", "content", "*", "content"),
)
# Claude Code's user id: a JSON object with a session_id (2.1.78 and later), or the older
# "user_<hash>_account_<uuid>_session_<uuid>".
_SESSION_IN_TEXT: Final = re.compile(r"_session_([0-9A-Za-z-]{1,128})$")
MAX_SESSION_CHARS: Final = 128


@attrs.frozen
class Translated:
    body: Json
    session_id: str | None
    # The fields dropped, as counter labels (bounded: KNOWN_DROPPED or "other"), and as the
    # client named them (for the debug log).
    dropped: tuple[tuple[str, str], ...]
    # The server tools dropped, by type (SERVER_TOOL_TYPES or "other"), in the client's order.
    dropped_tools: tuple[str, ...] = ()
    # The request enabled thinking (enabled or adaptive): only then does the answer show it.
    thinking: bool = False


# --- checks, in Anthropic's words --------------------------------------------------------------


def _fail(path: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {problem}", param=path)


def _required(body: Mapping[str, Any], key: str, path: str = "") -> Any:
    where = f"{path}.{key}" if path else key
    if key not in body:
        raise _fail(where, "Field required")
    return body[key]


def _obj(path: str, value: object) -> Json:
    if not isinstance(value, dict):
        raise _fail(path, "Input should be a valid dictionary")
    return value


def _list(path: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(path, "Input should be a valid list")
    return value


def _str(path: str, value: object) -> str:
    if not isinstance(value, str):
        raise _fail(path, "Input should be a valid string")
    return value


def _int(path: str, value: object, least: int) -> int:
    if type(value) is not int:
        raise _fail(path, "Input should be a valid integer")
    if value < least:
        raise _fail(path, f"Input should be greater than or equal to {least}")
    return value


def _number(path: str, value: object, low: float, high: float) -> float:
    if type(value) not in (int, float):
        raise _fail(path, "Input should be a valid number")
    number = float(value)  # type: ignore[arg-type]
    if not low <= number <= high:
        raise _fail(path, f"Input should be between {low:g} and {high:g}")
    return number


def _kind(path: str, block: Json, allowed: tuple[str, ...]) -> str:
    kind = _required(block, "type", path)
    if kind not in allowed:
        expected = ", ".join(f"'{a}'" for a in allowed)
        raise _fail(f"{path}.type", f"Input tag {kind!r} does not match any of {expected}")
    return str(kind)


# --- content -----------------------------------------------------------------------------------


def _image(path: str, block: Json) -> Json:
    source = _obj(f"{path}.source", _required(block, "source", path))
    kind = _kind(f"{path}.source", source, ("base64", "url", "file"))
    if kind == "file":
        raise UnsupportedParameter(
            f"{path}.source: images from the Files API are not supported by the gateway; "
            "send them as base64 or url",
            param=f"{path}.source",
        )
    if kind == "url":
        url = _str(f"{path}.source.url", _required(source, "url", f"{path}.source"))
    else:
        media = _str(f"{path}.source.media_type", _required(source, "media_type", f"{path}.source"))
        data = _str(f"{path}.source.data", _required(source, "data", f"{path}.source"))
        url = f"data:{media};base64,{data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _document_text(path: str, block: Json) -> Json:
    source = _obj(f"{path}.source", _required(block, "source", path))
    if source.get("type") != "text":
        raise UnsupportedParameter(
            f"{path}.source: only text documents are supported by the gateway",
            param=f"{path}.source",
        )
    return {"type": "text", "text": _str(f"{path}.source.data", source.get("data"))}


def _text(path: str, block: Json) -> str:
    return _str(f"{path}.text", _required(block, "text", path))


def _tool_result(path: str, block: Json) -> tuple[Json, list[Json]]:
    """A ``tool_result`` block → the tool message, and its images (a tool message holds text
    only: they go to the user message that follows)."""
    call_id = _str(f"{path}.tool_use_id", _required(block, "tool_use_id", path))
    content = block.get("content")
    texts: list[str] = []
    images: list[Json] = []
    if isinstance(content, str):
        texts.append(content)
    elif content is not None:
        for i, item in enumerate(_list(f"{path}.content", content)):
            item_path = f"{path}.content.{i}"
            part = _obj(item_path, item)
            kind = _kind(item_path, part, ("text", "image", "document", "search_result"))
            if kind == "text":
                texts.append(_text(item_path, part))
            elif kind == "image":
                images.append(_image(item_path, part))
            elif kind == "document":
                texts.append(_document_text(item_path, part)["text"])
    text = "\n".join(texts)
    if block.get("is_error") is True:
        # The chat shape has no flag for it: the model reads it in the result.
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": call_id, "content": text}, images


def _user(path: str, content: object, out: list[Json], extras: Extras) -> None:
    if isinstance(content, str):
        out.append({"role": "user", "content": content})
        return
    tools: list[Json] = []
    parts: list[Json] = []
    # Breakpoints: on a tool message (its index among the results), or on the user message.
    marks: list[tuple[int | None, Json | None]] = []
    for i, item in enumerate(_list(f"{path}.content", content)):
        item_path = f"{path}.content.{i}"
        block = _obj(item_path, item)
        kind = _kind(item_path, block, ("text", "image", "tool_result", "document"))
        marks.append((len(tools) if kind == "tool_result" else None, block_breakpoint(block)))
        if kind == "text":
            parts.append({"type": "text", "text": _text(item_path, block)})
        elif kind == "image":
            parts.append(_image(item_path, block))
        elif kind == "document":
            parts.append(_document_text(item_path, block))
        else:
            message, images = _tool_result(item_path, block)
            tools.append(message)
            parts.extend(images)
    base = len(out)
    out.extend(tools)
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        text = "\n".join(p["text"] for p in parts) if only_text else None
        out.append({"role": "user", "content": text if text is not None else parts})
    for tool, control in marks:
        if tool is not None:
            extras.mark_message(base + tool, control)
        elif parts:
            extras.mark_message(base + len(tools), control)


def _thinking_detail(path: str, block: Json, index: int) -> Json | None:
    """A thinking block → its ``reasoning_details`` entry; None for unsigned thinking (a vendor
    that signs nothing needs nothing back)."""
    thinking = _str(f"{path}.thinking", _required(block, "thinking", path))
    signature = _str(f"{path}.signature", block.get("signature") or "")
    try:
        entry = decode_signature(signature)
    except ValueError:
        raise _fail(f"{path}.signature", "Invalid signature") from None
    if entry is not None:
        return entry
    if not signature:
        return None
    entry = {"type": TEXT, "text": thinking, "signature": signature}
    return entry | {"format": ANTHROPIC, "index": index}


def _assistant(path: str, content: object, out: list[Json], extras: Extras) -> None:
    if isinstance(content, str):
        out.append({"role": "assistant", "content": content})
        return
    texts: list[str] = []
    calls: list[Json] = []
    details: list[Json] = []
    for i, item in enumerate(_list(f"{path}.content", content)):
        item_path = f"{path}.content.{i}"
        block = _obj(item_path, item)
        extras.mark_message(len(out), block_breakpoint(block))
        kind = _kind(
            item_path, block, ("text", "tool_use", "thinking", "redacted_thinking", "image")
        )
        if kind == "text":
            texts.append(_text(item_path, block))
        elif kind == "tool_use":
            tool_input = _obj(f"{item_path}.input", _required(block, "input", item_path))
            function = {
                "name": _str(f"{item_path}.name", _required(block, "name", item_path)),
                "arguments": json.dumps(tool_input, ensure_ascii=False),
            }
            call_id = _str(f"{item_path}.id", _required(block, "id", item_path))
            calls.append({"id": call_id, "type": "function", "function": function})
        elif kind == "thinking":
            entry = _thinking_detail(item_path, block, len(details))
            if entry is not None:
                details.append(entry)
        elif kind == "redacted_thinking":
            data = _str(f"{item_path}.data", _required(block, "data", item_path))
            details.append({"type": ENCRYPTED, "data": data, "format": ANTHROPIC})
            details[-1]["index"] = len(details) - 1
        else:
            raise _fail(f"{item_path}.type", "images are user content, not the assistant's")
    message: Json = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if details:
        message["reasoning_details"] = details
    if message["content"] is None and not calls:
        message["content"] = ""
    out.append(message)


def _system(value: object, path: str, out: list[Json], extras: Extras) -> None:
    if isinstance(value, str):
        out.append({"role": "system", "content": value})
        return
    texts = []
    for i, item in enumerate(_list(path, value)):
        block = _obj(f"{path}.{i}", item)
        _kind(f"{path}.{i}", block, ("text",))
        texts.append(_text(f"{path}.{i}", block))
        extras.mark_message(len(out), block_breakpoint(block))
    out.append({"role": "system", "content": "\n\n".join(texts)})


def _messages(body: Json, extras: Extras) -> list[Json]:
    out: list[Json] = []
    if body.get("system") is not None:
        _system(body["system"], "system", out, extras)
    for i, item in enumerate(_list("messages", _required(body, "messages"))):
        path = f"messages.{i}"
        message = _obj(path, item)
        role = _required(message, "role", path)
        if role not in ROLES:
            raise _fail(f"{path}.role", "Input should be 'user', 'assistant' or 'system'")
        content = _required(message, "content", path)
        if role == "system":
            # In its place: every provider's translation takes a system message anywhere.
            _system(content, f"{path}.content", out, extras)
        else:
            (_user if role == "user" else _assistant)(path, content, out, extras)
    if not any(m["role"] != "system" for m in out):
        raise _fail("messages", "at least one message is required")
    return out


# --- tools -------------------------------------------------------------------------------------


def _tools(
    value: object,
    dropped: list[tuple[str, str]],
    dropped_tools: list[str],
    builtin_tools: BuiltinTools,
    extras: Extras,
) -> list[Json]:
    tools: list[Json] = []
    for i, item in enumerate(_list("tools", value)):
        path = f"tools.{i}"
        tool = _obj(path, item)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            # A server tool (web search, code execution, bash, text editor, computer use): the
            # vendor runs it, so only Anthropic could, and not through the chat shape.
            named = kind if isinstance(kind, str) and kind in SERVER_TOOL_TYPES else OTHER_FIELD
            if builtin_tools == "refuse":
                raise UnsupportedParameter(
                    f"tools.{i}: '{named}' server tools are not supported by this model "
                    '(builtin_tools = "refuse"); only custom tools are',
                    param=f"{path}.type",
                )
            dropped.append(("server_tool", str(kind)[:64]))
            dropped_tools.append(named)
            continue
        function: Json = {"name": _str(f"{path}.name", _required(tool, "name", path))}
        if tool.get("description") is not None:
            function["description"] = _str(f"{path}.description", tool["description"])
        function["parameters"] = _obj(f"{path}.input_schema", _required(tool, "input_schema", path))
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"] is True
        extras.mark_tool(len(tools), block_breakpoint(tool))
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: object, chat: Json) -> None:
    choice = _obj("tool_choice", value)
    kind = _kind("tool_choice", choice, ("auto", "any", "tool", "none"))
    if kind == "tool":
        name = _str("tool_choice.name", _required(choice, "name", "tool_choice"))
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use") is True and kind != "none":
        chat["parallel_tool_calls"] = False


# --- reasoning ---------------------------------------------------------------------------------


def _budget_effort(budget: int) -> str:
    return next((effort for most, effort in BUDGET_EFFORTS if budget <= most), "xhigh")


def _reasoning(
    body: Json, chat: Json, max_tokens: int | None, without: MessagesWithoutThinking
) -> bool:
    """Sets the chat body's reasoning fields; True when the request enabled thinking."""
    effort: str | None = None
    config = body.get("output_config")
    if config is not None:
        config = _obj("output_config", config)
        if config.get("effort") is not None:
            wanted = config["effort"]
            # A list or an object is no key of EFFORTS (nor hashable): refused as any other.
            if not isinstance(wanted, str) or wanted not in EFFORTS:
                raise _fail("output_config.effort", f"Input should be one of {', '.join(EFFORTS)}")
            effort = EFFORTS[wanted]
        if config.get("format") is not None:
            chat["response_format"] = _format(config["format"])
    thinking = body.get("thinking")
    if thinking is None:
        if without == "off":
            # Anthropic's effort without thinking governs the answer's other tokens, which
            # no other vendor has a knob for: it is not sent as a reasoning effort here.
            chat["reasoning"] = False
        elif effort is not None:
            chat["reasoning_effort"] = effort
        return False
    thinking = _obj("thinking", thinking)
    kind = _kind("thinking", thinking, ("enabled", "disabled", "adaptive"))
    if kind == "disabled":
        chat["reasoning"] = False
        return False
    if kind == "enabled":
        budget = _int(
            "thinking.budget_tokens",
            _required(thinking, "budget_tokens", "thinking"),
            MIN_THINKING_BUDGET,
        )
        if max_tokens is not None and budget >= max_tokens:
            raise _fail("max_tokens", "must be greater than thinking.budget_tokens")
        effort = effort or _budget_effort(budget)
    chat["reasoning"] = True
    if effort is not None:
        chat["reasoning_effort"] = effort
    return True


def _format(value: object) -> Json:
    spec = _obj("output_config.format", value)
    _kind("output_config.format", spec, ("json_schema",))
    schema = _obj("output_config.format.schema", _required(spec, "schema", "output_config.format"))
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


# --- the body ----------------------------------------------------------------------------------


def session_of(user_id: str) -> str | None:
    """The session a Claude Code user id names, for replica affinity; None for another id."""
    text = user_id.strip()
    session: object = None
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            return None
        session = parsed.get("session_id") if isinstance(parsed, dict) else None
    else:
        match = _SESSION_IN_TEXT.search(text)
        session = match.group(1) if match else None
    if not isinstance(session, str) or not session.strip():
        return None
    return session.strip()[:MAX_SESSION_CHARS]


def translate(
    body: object,
    *,
    count_only: bool = False,
    builtin_tools: BuiltinTools = "drop",
    anthropic_beta: str | None = None,
    without_thinking: MessagesWithoutThinking = "model_default",
) -> Translated:
    """A Messages body → the chat body (``count_tokens`` when ``count_only``: ``max_tokens``
    is not required there, and ``stream`` means nothing). Server tools are dropped, or the
    request refused, as the alias's ``builtin_tools`` says; a request without thinking asks
    the provider what the alias's ``messages_without_thinking`` says."""
    body = _obj("body", body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("model", "Field required")
    dropped: list[tuple[str, str]] = []
    dropped_tools: list[str] = []
    extras = Extras()
    chat: Json = {"model": model, "messages": _messages(body, extras)}
    max_tokens: int | None = None
    if not count_only or body.get("max_tokens") is not None:
        max_tokens = _int("max_tokens", _required(body, "max_tokens"), 1)
        chat["max_tokens"] = max_tokens
    if body.get("stop_sequences") is not None:
        stops = [
            _str(f"stop_sequences.{i}", s)
            for i, s in enumerate(_list("stop_sequences", body["stop_sequences"]))
        ]
        if stops:
            chat["stop"] = stops
    if body.get("temperature") is not None:
        chat["temperature"] = _number("temperature", body["temperature"], 0, 1)
    if body.get("top_p") is not None:
        chat["top_p"] = _number("top_p", body["top_p"], 0, 1)
    if body.get("top_k") is not None:
        chat["top_k"] = _int("top_k", body["top_k"], 0)
    session = None
    metadata = body.get("metadata")
    if metadata is not None:
        user_id = _obj("metadata", metadata).get("user_id")
        if user_id is not None:
            chat["user"] = _str("metadata.user_id", user_id)
            session = session_of(chat["user"])
    if body.get("tools") is not None:
        tools = _tools(body["tools"], dropped, dropped_tools, builtin_tools, extras)
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
        if "tools" not in chat and chat["tool_choice"] != "none":
            # Only server tools were named (dropped): nothing left to choose from.
            dropped.append(("tool_choice", "tool_choice"))
            chat.pop("tool_choice")
            chat.pop("parallel_tool_calls", None)
    thinking = _reasoning(body, chat, max_tokens, without_thinking)
    if body.get("stream") is not None and not count_only:
        if type(body["stream"]) is not bool:
            raise _fail("stream", "Input should be a valid boolean")
        chat["stream"] = body["stream"]
    keep_fields(body, extras, anthropic_beta)
    kept = extras.body()
    if kept is not None and not count_only:
        chat[ANTHROPIC_EXTRAS] = kept
    for key in body:
        if key not in TRANSLATED and key not in kept_fields(kept):
            dropped.append((key if key in KNOWN_DROPPED else OTHER_FIELD, str(key)[:64]))
    return Translated(
        body=chat,
        session_id=session,
        dropped=tuple(dropped),
        dropped_tools=tuple(dropped_tools),
        thinking=thinking,
    )
