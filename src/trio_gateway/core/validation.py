"""OpenAI's rules for a chat completion body, checked at the front before any provider is chosen.

A request a vendor would refuse is refused here, with the error OpenAI itself would give: the
same ``param`` path (``messages[2].content[0].type``) and the same kind of wording, so a client
learns what is wrong without a provider ever being asked, and every provider sees only bodies
OpenAI would accept.

Pure: it reads the body and never changes it. Only fields OpenAI defines are checked; anything
else (vLLM's ``top_k``, ``chat_template_kwargs``, ``guided_json`` ...) passes through as given.
The checks are tables of small functions: one per field, per role, per content part type.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, Final, TypeAlias

from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.reasoning_details import check_details
from trio_gateway.core.validation_values import (
    Check,
    array,
    boolean,
    enum_value,
    invalid,
    json_object,
    number,
    one_of,
    optional_fields,
    quote,
    required,
    string,
    too_long,
    wrong_type,
)

# Objects and arrays inside one another, the body itself being level 1. The JSON parser allows
# about a thousand; nothing OpenAI accepts comes near 64, and whatever walks a tool schema next
# (a provider's translator, a constrained decoder) should not meet one nested deeper.
MAX_DEPTH: Final = 64
MAX_TOOLS: Final = 128
MAX_STOP_SEQUENCES: Final = 4
MAX_METADATA_KEYS: Final = 16
MAX_METADATA_KEY_CHARS: Final = 64
MAX_METADATA_VALUE_CHARS: Final = 512
MAX_TOP_LOGPROBS: Final = 20

ROLES: Final = ("system", "developer", "user", "assistant", "tool", "function")
NAME_PATTERN: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
IMAGE_DETAILS: Final = ("auto", "low", "high", "original")
AUDIO_FORMATS: Final = ("wav", "mp3")
RESPONSE_FORMATS: Final = ("text", "json_object", "json_schema")
TOOL_CHOICE_MODES: Final = ("none", "auto", "required")
MODALITIES: Final = ("text", "audio")
SERVICE_TIERS: Final = ("auto", "default", "flex", "scale", "priority")
VERBOSITIES: Final = ("low", "medium", "high")
# Tool kinds OpenAI defines that the gateway cannot carry to every provider: refused as
# unsupported rather than as invalid, because OpenAI itself would accept them.
UNSUPPORTED_TOOL_KINDS: Final = ("custom",)
UNSUPPORTED_TOOL_CHOICES: Final = ("custom", "allowed_tools")

# A check of one object (a message, a content part) already known to be an object.
ObjectCheck: TypeAlias = Callable[[str, dict[str, Any]], None]


def _name(path: str, value: object) -> str:
    """A tool or schema name, as OpenAI restricts them."""
    name = string(path, value)
    if len(name) > 64:
        raise too_long(path, 64, len(name))
    if not NAME_PATTERN.fullmatch(name):
        raise invalid(
            path,
            "string does not match pattern. Expected a string that matches the pattern "
            "'^[a-zA-Z0-9_-]{1,64}$'.",
        )
    return name


def _tool_kind(path: str, value: object) -> None:
    kind = enum_value(path, value, ("function", *UNSUPPORTED_TOOL_KINDS))
    if kind in UNSUPPORTED_TOOL_KINDS:
        raise UnsupportedParameter(
            f"'{kind}' tools are not supported by the gateway; use 'function' tools", param=path
        )


# --- content parts -----------------------------------------------------------------------------
def _text_part(path: str, part: dict[str, Any]) -> None:
    string(f"{path}.text", required(part, "text", path))


def _refusal_part(path: str, part: dict[str, Any]) -> None:
    string(f"{path}.refusal", required(part, "refusal", path))


def _image_part(path: str, part: dict[str, Any]) -> None:
    image_path = f"{path}.image_url"
    image = json_object(image_path, required(part, "image_url", path))
    url = string(f"{image_path}.url", required(image, "url", image_path))
    if not url[:8].lower().startswith(("http://", "https://", "data:")):
        raise invalid(
            f"{image_path}.url",
            "Expected an http(s) URL or a base64-encoded data URL "
            f"('data:image/png;base64,...'), but got {quote(url)} instead.",
        )
    optional_fields(image_path, image, {"detail": partial(enum_value, allowed=IMAGE_DETAILS)})


def _audio_part(path: str, part: dict[str, Any]) -> None:
    audio_path = f"{path}.input_audio"
    audio = json_object(audio_path, required(part, "input_audio", path))
    string(f"{audio_path}.data", required(audio, "data", audio_path))
    enum_value(f"{audio_path}.format", required(audio, "format", audio_path), AUDIO_FORMATS)


def _file_part(path: str, part: dict[str, Any]) -> None:
    file_path = f"{path}.file"
    file = json_object(file_path, required(part, "file", path))
    optional_fields(file_path, file, {"file_data": string, "file_id": string, "filename": string})


# The part types each role may send, as OpenAI's message types define them.
TEXT_PARTS: Final[Mapping[str, ObjectCheck]] = MappingProxyType({"text": _text_part})
USER_PARTS: Final[Mapping[str, ObjectCheck]] = MappingProxyType(
    {"text": _text_part, "image_url": _image_part, "input_audio": _audio_part, "file": _file_part}
)
ASSISTANT_PARTS: Final[Mapping[str, ObjectCheck]] = MappingProxyType(
    {"text": _text_part, "refusal": _refusal_part}
)


def _part(path: str, value: object, parts: Mapping[str, ObjectCheck]) -> None:
    part = json_object(path, value)
    kind = enum_value(f"{path}.type", required(part, "type", path), tuple(parts))
    parts[kind](path, part)


def _content(path: str, value: object, parts: Mapping[str, ObjectCheck]) -> None:
    """A message's content: a string, or a non-empty array of the parts its role may send."""
    if isinstance(value, str):
        return
    expected = "one of a string or array of objects"
    for i, part in enumerate(array(path, value, min_items=1, expected=expected)):
        _part(f"{path}[{i}]", part, parts)


# --- messages ----------------------------------------------------------------------------------
def _function_call(path: str, value: object) -> None:
    call = json_object(path, value)
    string(f"{path}.name", required(call, "name", path))
    string(f"{path}.arguments", required(call, "arguments", path))


def _tool_calls(path: str, value: object) -> None:
    for i, item in enumerate(array(path, value, min_items=1)):
        call_path = f"{path}[{i}]"
        call = json_object(call_path, item)
        string(f"{call_path}.id", required(call, "id", call_path))
        _tool_kind(f"{call_path}.type", required(call, "type", call_path))
        _function_call(f"{call_path}.function", required(call, "function", call_path))


def _audio_reference(path: str, value: object) -> None:
    audio = json_object(path, value)
    string(f"{path}.id", required(audio, "id", path))


# What stands in for an assistant's content when it has none.
ASSISTANT_FIELDS: Final[Mapping[str, Check]] = MappingProxyType(
    {
        "tool_calls": _tool_calls,
        "function_call": _function_call,
        "refusal": string,
        "audio": _audio_reference,
    }
)


def _content_message(parts: Mapping[str, ObjectCheck]) -> ObjectCheck:
    """A message whose content is required: a string or a list of ``parts``."""

    def check(path: str, message: dict[str, Any]) -> None:
        _content(f"{path}.content", required(message, "content", path), parts)

    return check


def _assistant_message(path: str, message: dict[str, Any]) -> None:
    optional_fields(path, message, ASSISTANT_FIELDS)
    # The gateway's extension (core/reasoning_details.py): never content on its own.
    optional_fields(path, message, {"reasoning_details": check_details})
    content = message.get("content")
    if content is not None:
        _content(f"{path}.content", content, ASSISTANT_PARTS)
    elif all(message.get(key) is None for key in ASSISTANT_FIELDS):
        raise InvalidRequest(
            f"Missing required parameter: '{path}.content'. An assistant message needs "
            f"'content' unless it has {one_of(tuple(ASSISTANT_FIELDS), 'or')}.",
            param=f"{path}.content",
        )


def _tool_message(path: str, message: dict[str, Any]) -> None:
    string(f"{path}.tool_call_id", required(message, "tool_call_id", path))
    _content_message(TEXT_PARTS)(path, message)


def _function_message(path: str, message: dict[str, Any]) -> None:
    string(f"{path}.name", required(message, "name", path))
    content = required(message, "content", path)
    if content is not None:
        string(f"{path}.content", content)


ROLE_CHECKS: Final[Mapping[str, ObjectCheck]] = MappingProxyType(
    {
        "system": _content_message(TEXT_PARTS),
        "developer": _content_message(TEXT_PARTS),
        "user": _content_message(USER_PARTS),
        "assistant": _assistant_message,
        "tool": _tool_message,
        "function": _function_message,
    }
)


MESSAGE_FIELDS: Final[Mapping[str, Check]] = MappingProxyType({"name": string})
# Roles whose message is valid as it stands when its content is one string and its name, if
# any, a string (the assistant's also needs none of ASSISTANT_FIELDS).
TEXT_ROLES: Final = frozenset({"system", "developer", "user", "assistant"})


# What makes an assistant message with one string of content more than text.
_NOT_PLAIN: Final = (*ASSISTANT_FIELDS, "reasoning_details")


def _message(path: str, value: object) -> None:
    message = json_object(path, value)
    role = enum_value(f"{path}.role", required(message, "role", path), ROLES)
    optional_fields(path, message, MESSAGE_FIELDS)
    ROLE_CHECKS[role](path, message)


def _plain_text(message: object) -> bool:
    """A message the checks would pass, told without building the paths they quote: most
    messages are a role and one string."""
    if not isinstance(message, dict):
        return False
    role, name = message.get("role"), message.get("name")
    if not (
        isinstance(role, str)
        and role in TEXT_ROLES
        and isinstance(message.get("content"), str)
        and (name is None or isinstance(name, str))
    ):
        return False
    return role != "assistant" or all(message.get(key) is None for key in _NOT_PLAIN)


def _messages(path: str, value: object) -> None:
    for i, message in enumerate(array(path, value, min_items=1)):
        if not _plain_text(message):
            _message(f"{path}[{i}]", message)


# --- tools -------------------------------------------------------------------------------------

FUNCTION_FIELDS: Final[Mapping[str, Check]] = MappingProxyType(
    {"description": string, "parameters": json_object, "strict": boolean}
)


def _tool(path: str, value: object) -> str:
    """One tool definition; returns its function's name."""
    tool = json_object(path, value)
    _tool_kind(f"{path}.type", required(tool, "type", path))
    function_path = f"{path}.function"
    function = json_object(function_path, required(tool, "function", path))
    name = _name(f"{function_path}.name", required(function, "name", function_path))
    optional_fields(function_path, function, FUNCTION_FIELDS)
    return name


def _tools(path: str, value: object) -> None:
    seen: set[str] = set()
    for i, tool in enumerate(array(path, value, min_items=1, max_items=MAX_TOOLS)):
        name = _tool(f"{path}[{i}]", tool)
        if name in seen:
            # Which of two same-named functions the model "called" could not be told apart.
            raise invalid(
                f"{path}[{i}].function.name",
                f"duplicate function name {quote(name)}. Each tool needs a unique name.",
            )
        seen.add(name)


def _tool_choice(path: str, value: object) -> None:
    if isinstance(value, str):
        enum_value(path, value, TOOL_CHOICE_MODES)
        return
    if not isinstance(value, dict):
        raise wrong_type(path, "one of a string or an object", value)
    kind = enum_value(
        f"{path}.type", required(value, "type", path), ("function", *UNSUPPORTED_TOOL_CHOICES)
    )
    if kind in UNSUPPORTED_TOOL_CHOICES:
        raise UnsupportedParameter(
            f"tool_choice of type '{kind}' is not supported by the gateway; "
            "use 'none', 'auto', 'required' or a named function",
            param=f"{path}.type",
        )
    function_path = f"{path}.function"
    function = json_object(function_path, required(value, "function", path))
    string(f"{function_path}.name", required(function, "name", function_path))


# --- other fields ------------------------------------------------------------------------------
def _stop(path: str, value: object) -> None:
    if isinstance(value, str):
        return
    expected = "one of a string or array of strings"
    for i, stop in enumerate(array(path, value, max_items=MAX_STOP_SEQUENCES, expected=expected)):
        string(f"{path}[{i}]", stop)


JSON_SCHEMA_FIELDS: Final[Mapping[str, Check]] = MappingProxyType(
    {"description": string, "schema": json_object, "strict": boolean}
)


def _response_format(path: str, value: object) -> None:
    response_format = json_object(path, value)
    kind = enum_value(f"{path}.type", required(response_format, "type", path), RESPONSE_FORMATS)
    if kind != "json_schema":
        return
    schema_path = f"{path}.json_schema"
    spec = json_object(schema_path, required(response_format, "json_schema", path))
    _name(f"{schema_path}.name", required(spec, "name", schema_path))
    optional_fields(schema_path, spec, JSON_SCHEMA_FIELDS)


def _stream_options(path: str, value: object) -> None:
    options = json_object(path, value)
    optional_fields(path, options, {"include_usage": boolean, "include_obfuscation": boolean})


def _logit_bias(path: str, value: object) -> None:
    in_range = number("decimal", -100, 100)
    for token, bias in json_object(path, value).items():
        # Keys are token ids; JSON object keys are strings, so "50256".
        if not (isinstance(token, str) and token.isascii() and token.isdigit()):
            raise invalid(path, f"{quote(str(token))} is not a token id (an integer, as a string).")
        in_range(f"{path}.{token}", bias)


def _metadata(path: str, value: object) -> None:
    metadata = json_object(path, value)
    if len(metadata) > MAX_METADATA_KEYS:
        raise invalid(
            path,
            f"too many properties. Expected an object with at most {MAX_METADATA_KEYS} "
            f"properties, but got an object with {len(metadata)} properties instead.",
        )
    for key, item in metadata.items():
        item_path = f"{path}.{key}"
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise InvalidRequest(
                f"Invalid property name in '{path}': {quote(key)} is too long. Expected a "
                f"string with maximum length {MAX_METADATA_KEY_CHARS}, but got a string with "
                f"length {len(key)} instead.",
                param=item_path,
            )
        if len(string(item_path, item)) > MAX_METADATA_VALUE_CHARS:
            raise too_long(item_path, MAX_METADATA_VALUE_CHARS, len(item))


def _modalities(path: str, value: object) -> None:
    for i, modality in enumerate(array(path, value)):
        enum_value(f"{path}[{i}]", modality, MODALITIES)


# Every top-level field checked besides messages (required, so checked first, on its own). A
# field that is absent or null is not checked (null is "not given" at OpenAI too); fields not
# named here are not looked at.
FIELD_CHECKS: Final[Mapping[str, Check]] = MappingProxyType(
    {
        "tools": _tools,
        "tool_choice": _tool_choice,
        "parallel_tool_calls": boolean,
        "response_format": _response_format,
        "stream": boolean,
        "stream_options": _stream_options,
        "temperature": number("decimal", 0, 2),
        "top_p": number("decimal", 0, 1),
        "presence_penalty": number("decimal", -2, 2),
        "frequency_penalty": number("decimal", -2, 2),
        "n": number("integer", 1),
        "max_tokens": number("integer", 1),
        "max_completion_tokens": number("integer", 1),
        "seed": number("integer", -(2**63), 2**63 - 1),
        "logprobs": boolean,
        "top_logprobs": number("integer", 0, MAX_TOP_LOGPROBS),
        "logit_bias": _logit_bias,
        "stop": _stop,
        "user": string,
        "metadata": _metadata,
        "store": boolean,
        "modalities": _modalities,
        "service_tier": partial(enum_value, allowed=SERVICE_TIERS),
        "verbosity": partial(enum_value, allowed=VERBOSITIES),
        "prompt_cache_key": string,
        "safety_identifier": string,
    }
)


# --- rules between fields ----------------------------------------------------------------------
def _only_with_tools(body: Mapping[str, Any]) -> None:
    # OpenAI refuses both without tools, parallel_tool_calls even when false; only an explicit
    # tool_choice "none" (which asks for nothing) is let through.
    if body.get("tools") is not None:
        return
    for field in ("tool_choice", "parallel_tool_calls"):
        if body.get(field) not in (None, "none"):
            raise InvalidRequest(
                f"Invalid value for '{field}': '{field}' is only allowed when 'tools' are "
                "specified.",
                param=field,
            )


def _named_tool_is_defined(body: Mapping[str, Any]) -> None:
    choice = body.get("tool_choice")
    tools = body.get("tools")
    if not isinstance(choice, dict) or tools is None:
        return
    name = choice["function"]["name"]
    defined = [tool["function"]["name"] for tool in tools]
    if name not in defined:
        raise InvalidRequest(
            f"Invalid value for 'tool_choice.function.name': no function named {quote(name)} "
            f"in 'tools'. Defined functions are: {one_of(defined)}.",
            param="tool_choice.function.name",
        )


def _stream_options_need_stream(body: Mapping[str, Any]) -> None:
    if body.get("stream_options") is not None and body.get("stream") is not True:
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
        )


# Run after every field has its right shape, so each may index into the fields it reads.
CROSS_CHECKS: Final[tuple[Callable[[Mapping[str, Any]], None], ...]] = (
    _only_with_tools,
    _named_tool_is_defined,
    _stream_options_need_stream,
)


# --- depth -------------------------------------------------------------------------------------

# The way from the body to a value: (the parent's trail, key or index), built only as a chain
# of pairs so that walking a large body costs no string per node.
Trail: TypeAlias = "tuple[Trail, str | int] | None"


def _render(trail: Trail) -> str:
    keys: list[str | int] = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in reversed(keys))[1:]


def _children(value: object) -> Iterable[tuple[str | int, Any]]:
    if isinstance(value, dict):
        return value.items()
    return enumerate(value) if isinstance(value, list) else ()


def _depth(body: object) -> None:
    """Refuse a body nested deeper than MAX_DEPTH, naming the first value past the limit.

    A loop with its own stack, not recursion: the body may be nested as deep as the parser
    allows, which is deeper than this function should recurse."""
    stack: list[tuple[object, int, Trail]] = [(body, 1, None)]
    while stack:
        value, depth, trail = stack.pop()
        if depth > MAX_DEPTH:
            path = _render(trail)
            raise invalid(
                path,
                f"nested too deeply. Expected at most {MAX_DEPTH} levels of objects and arrays "
                "in the request body.",
            )
        for key, child in _children(value):
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, (trail, key)))


# --- the entry point ---------------------------------------------------------------------------
# Where each top-level field comes in FIELD_CHECKS: the order its checks run in.
FIELD_ORDER: Final[Mapping[str, int]] = MappingProxyType(
    {key: i for i, key in enumerate(FIELD_CHECKS)}
)


def _top_level_fields(body: Mapping[str, Any]) -> None:
    """``optional_fields("", body, FIELD_CHECKS)``, looking up the body's few keys in the
    table rather than the table's 26 in the body; in the table's order, so that of two wrong
    fields the same one is named."""
    present = [key for key in body if key in FIELD_CHECKS]
    if len(present) > 1:
        present.sort(key=FIELD_ORDER.__getitem__)
    for key in present:
        value = body[key]
        if value is not None:
            FIELD_CHECKS[key](key, value)


def within_depth(raw: bytes) -> bool:
    """Whether a JSON text cannot nest deeper than MAX_DEPTH: every level opens with a ``{``
    or ``[``, and counting them (those in strings too, and in any encoding JSON allows, as each
    of them holds the byte) counts at least as many as there are levels."""
    return raw.count(b"{") + raw.count(b"[") <= MAX_DEPTH


def validate_body(body: Mapping[str, Any], *, depth_known: bool = False) -> None:
    """Raise the error OpenAI would give for ``body``, or return if it would accept it.

    ``model`` is the caller's to check (it is an alias here, not a model). Raises
    :class:`InvalidRequest`, or :class:`UnsupportedParameter` for what OpenAI accepts and the
    gateway cannot carry (custom tools, ``allowed_tools``). ``depth_known``: the caller has
    found the body within MAX_DEPTH (:func:`within_depth` of its text), so it is not walked."""
    if not depth_known:
        _depth(body)
    # Required, and null is no conversation: checked whatever its value.
    _messages("messages", required(body, "messages", ""))
    _top_level_fields(body)
    for check in CROSS_CHECKS:
        check(body)
