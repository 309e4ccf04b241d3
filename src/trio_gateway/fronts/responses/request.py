"""A Responses API body (``POST /v1/responses``) as the gateway's chat body. Pure.

The mapping is docs/api.md's table ("The Responses front"). In short: ``instructions`` is the
first system message; ``input`` items become chat messages (``items.py``: one assistant message
per turn of the model's, ``item_reference`` items read as the items they name). Function tools
are unflattened to chat's ``{"type": "function", "function": ...}``; a ``namespace`` tool's
functions become functions named ``<namespace>__<name>`` (the answer names them back,
:attr:`ResponsesRequest.tool_names`); built-in tools are dropped or refused per alias
(``builtin_tools``).

Every field the gateway reads is checked as the API checks it, and a refusal names the field as
the client sent it (``max_output_tokens``, ``input[3].type``); what the chat validation that
follows still finds is renamed the same way (:meth:`ResponsesRequest.client_param`). Fields the
gateway cannot honour are refused when dropping them would change the answer
(``conversation``, ``prompt``, ``background: true``); the others it does not use are dropped,
each named in :attr:`ResponsesRequest.dropped_fields` for the log and the metric.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Literal

import attrs

from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.request import REASONING_EFFORTS
from trio_gateway.core.validation import FIELD_CHECKS as CHAT_CHECKS
from trio_gateway.core.validation_values import (
    Check,
    array,
    boolean,
    enum_value,
    json_object,
    number,
    optional_fields,
    required,
    string,
)
from trio_gateway.fronts.responses.items import (
    Item,
    Opener,
    Prefix,
    Turns,
    flat_name,
    input_items,
)

__all__ = ["ResponsesRequest", "flat_name", "parse_responses_body"]

BuiltinTools = Literal["drop", "refuse"]

# Fields read here; everything else in a body is dropped (and counted).
HANDLED: Final = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "max_output_tokens",
        "text",
        "temperature",
        "top_p",
        "stream",
        "store",
        "previous_response_id",
        "prompt_cache_key",
        "metadata",
        "user",
        "safety_identifier",
    }
)
SEALED_REASONING: Final = "reasoning.encrypted_content"
# Fields dropped by name in the metric: what clients are known to send. Any other is "other",
# so a client's field names never become label values without bound.
KNOWN_DROPPED: Final = frozenset(
    {
        "include",
        "client_metadata",
        "truncation",
        "service_tier",
        "prompt_cache_retention",
        "top_logprobs",
        "max_tool_calls",
        "stream_options",
        "background",
        "context_management",
        "text.verbosity",
        "reasoning.generate_summary",
        "reasoning_unopened",
        "tool_output_image",
        "input_item",
    }
)
# Fields that change what the answer is, and that the gateway cannot honour.
REFUSED: Final = ("conversation", "prompt")
BUILTIN_TOOL_TYPES: Final = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "computer",
        "computer_use_preview",
        "code_interpreter",
        "image_generation",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
        "custom",
    }
)
REASONING_SUMMARIES: Final = ("auto", "concise", "detailed", "none")
VERBOSITIES: Final = ("low", "medium", "high")
TRUNCATIONS: Final = ("auto", "disabled")
# The API's floor for max_output_tokens (its chat's max_completion_tokens takes 1).
MIN_OUTPUT_TOKENS: Final = 16
# Where a body's messages and their parts are (core/body.py bounds them): the input items, and
# the content of each; the same in a WebSocket's response.create, whose body is top level.
RESPONSES_PARTS: Final = (("input",), ("input", "*", "content"))


def _reasoning(path: str, value: object) -> None:
    reasoning = json_object(path, value)
    optional_fields(
        path,
        reasoning,
        {
            "effort": lambda p, v: enum_value(p, v, REASONING_EFFORTS),
            "summary": lambda p, v: enum_value(p, v, REASONING_SUMMARIES),
        },
    )


def _text(path: str, value: object) -> None:
    text = json_object(path, value)
    optional_fields(path, text, {"verbosity": lambda p, v: enum_value(p, v, VERBOSITIES)})


def _strings(path: str, value: object) -> None:
    for i, one in enumerate(array(path, value)):
        string(f"{path}[{i}]", one)


# Each top-level field the front reads (or drops, when its type is the API's plain one), checked
# under its own name before anything is translated; absent or null is "not given".
FIELD_CHECKS: Final[Mapping[str, Check]] = MappingProxyType(
    {
        "instructions": string,
        "stream": boolean,
        "store": boolean,
        "background": boolean,
        "parallel_tool_calls": boolean,
        "temperature": CHAT_CHECKS["temperature"],
        "top_p": CHAT_CHECKS["top_p"],
        "max_output_tokens": number("integer", MIN_OUTPUT_TOKENS),
        "max_tool_calls": number("integer", 1),
        "top_logprobs": CHAT_CHECKS["top_logprobs"],
        "metadata": CHAT_CHECKS["metadata"],
        "user": string,
        "safety_identifier": string,
        "prompt_cache_key": string,
        "previous_response_id": string,
        "reasoning": _reasoning,
        "text": _text,
        "include": _strings,
        "truncation": lambda p, v: enum_value(p, v, TRUNCATIONS),
        "service_tier": string,
    }
)
# Chat's names of what the front writes from another field: a chat error names the field.
CHAT_NAMES: Final = (
    ("max_completion_tokens", "max_output_tokens"),
    ("reasoning_effort", "reasoning.effort"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("tool_choice.function", "tool_choice"),
)
_PATH_END: Final = re.compile(r"[.\[]")


@attrs.frozen(kw_only=True)
class ResponsesRequest:
    """What a Responses body asks for, as the gateway serves it."""

    chat: dict[str, Any]  # the chat body (validated later as any chat request)
    echo: dict[str, Any]  # the request's settings, as the response object repeats them
    stream: bool
    store: bool
    previous_response_id: str | None
    session: str | None  # prompt_cache_key: which conversation, for replica affinity
    summary: bool  # reasoning written as a summary (reasoning.summary asked for)
    # include: ["reasoning.encrypted_content"]: every reasoning item carries one, as OpenAI's do,
    # even where the gateway has nothing to seal (a vLLM model's thinking).
    sealed_reasoning: bool
    tool_names: dict[str, tuple[str, str]]  # flattened name -> (namespace, name)
    input_items: list[Item]  # the input's items the gateway used, as a stored response keeps them
    dropped_fields: tuple[str, ...]
    dropped_tools: tuple[str, ...]
    # A chat path's start → the client's: what each chat message and tool was made from.
    sources: tuple[tuple[str, str], ...] = ()
    # The history as it was read, asked for (``snapshot``) to go on from (a WebSocket's).
    history: Prefix | None = None

    def client_param(self, param: str) -> str:
        """A param of the chat body, named as the client sent it."""
        for chat, client in (*CHAT_NAMES, *self.sources):
            if param == chat or (
                param.startswith(chat) and _PATH_END.match(param, len(chat)) is not None
            ):
                return client + param[len(chat) :]
        return param


def parse_responses_body(
    body: object,
    *,
    history: Sequence[Mapping[str, Any]] = (),
    referenced: Mapping[str, Item] = MappingProxyType({}),
    opener: Opener,
    builtin_tools: BuiltinTools = "drop",
    prefix: Prefix | None = None,
    snapshot: bool = False,
) -> ResponsesRequest:
    """The chat body a Responses body asks for; ``history`` the items of the conversation
    ``previous_response_id`` names (each turn's input and output), read before this input,
    after ``prefix`` (what its first items were read as, when known); ``referenced`` the items
    its ``item_reference`` items name, by id. ``snapshot``: the history as read is kept in
    :attr:`ResponsesRequest.history`."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    optional_fields("", body, FIELD_CHECKS)
    dropped: list[str] = []
    for field in body:
        if field not in HANDLED and body[field] is not None:
            if field in REFUSED or (field == "background" and body[field] is True):
                raise UnsupportedParameter(
                    f"'{field}' is not supported by the gateway's Responses front", param=field
                )
            dropped.append(field if field in KNOWN_DROPPED else "other")
    include = body.get("include") or ()
    if SEALED_REASONING in include and "include" in dropped and set(include) == {SEALED_REASONING}:
        dropped.remove("include")  # the one include the gateway serves
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string (an alias)", param="model")
    chat: dict[str, Any] = {"model": model}
    echo: dict[str, Any] = {}

    tools, tool_names, dropped_tools, tool_sources = _tools(body.get("tools"), builtin_tools)
    items = input_items(body.get("input"))
    turns = Turns(tool_names, opener, dropped, referenced)
    instructions = body.get("instructions")
    if instructions is not None:
        turns.messages.append({"role": "system", "content": instructions})
        turns.sources.append("instructions")
    first, dropped_from = len(turns.messages), len(dropped)
    read = turns.history(history, prefix)
    history_read = turns.snapshot(first, dropped_from, read) if snapshot else None
    kept: list[Item] = []
    for i, item in enumerate(items):
        one = turns.add(f"input[{i}]", item)
        if one is not None:
            kept.append(one)
    messages = turns.finish()
    if not messages:
        raise InvalidRequest("'input' must not be empty", param="input")
    chat["messages"] = messages

    if tools:
        chat["tools"] = tools
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    choice = body.get("tool_choice")
    if choice is not None:
        chat_choice = _tool_choice(choice)
        if tools or chat_choice == "none":
            chat["tool_choice"] = chat_choice
    stream = body.get("stream") is True
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    for field in ("temperature", "top_p", "user", "safety_identifier", "prompt_cache_key"):
        if body.get(field) is not None:
            chat[field] = body[field]
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    reasoning: dict[str, Any] = body.get("reasoning") or {}
    if reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    summary = reasoning.get("summary") not in (None, "none")
    if reasoning.get("generate_summary") is not None:
        dropped.append("reasoning.generate_summary")
    text: dict[str, Any] = body.get("text") or {}
    if text.get("format") is not None:
        response_format = _text_format(text["format"])
        if response_format is not None:
            chat["response_format"] = response_format
    if text.get("verbosity") is not None:
        dropped.append("text.verbosity")

    store = body.get("store") is not False
    previous = body.get("previous_response_id")
    session = body.get("prompt_cache_key")
    echo.update(
        instructions=instructions,
        max_output_tokens=body.get("max_output_tokens"),
        metadata=body.get("metadata") or {},
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        previous_response_id=previous,
        reasoning={"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        store=store,
        temperature=body.get("temperature"),
        text={"format": text.get("format") or {"type": "text"}},
        tool_choice=choice if choice is not None else "auto",
        tools=[t for t in body.get("tools") or () if t.get("type") not in BUILTIN_TOOL_TYPES],
        top_p=body.get("top_p"),
        user=body.get("user"),
        prompt_cache_key=session,
        truncation="disabled",
    )
    message_sources = [(f"messages[{i}]", path) for i, path in enumerate(turns.sources)]
    return ResponsesRequest(
        chat=chat,
        echo=echo,
        stream=stream,
        store=store,
        previous_response_id=previous,
        session=session if isinstance(session, str) and session.strip() else None,
        summary=summary,
        sealed_reasoning=SEALED_REASONING in include,
        tool_names=tool_names,
        input_items=kept,
        dropped_fields=tuple(dropped),
        dropped_tools=dropped_tools,
        sources=(*tool_sources, *message_sources, ("messages", "input")),
        history=history_read,
    )


def _function(path: str, tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if tool.get("description") is not None:
        function["description"] = string(f"{path}.description", tool["description"])
    parameters = tool.get("parameters")
    function["parameters"] = (
        json_object(f"{path}.parameters", parameters)
        if parameters is not None
        else {"type": "object", "properties": {}}
    )
    if isinstance(tool.get("strict"), bool):
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _tools(
    value: object, builtin_tools: BuiltinTools
) -> tuple[
    list[dict[str, Any]],
    dict[str, tuple[str, str]],
    tuple[str, ...],
    list[tuple[str, str]],
]:
    """Chat tools, the flattened names of namespaced functions, the built-in tools dropped,
    and where each chat tool came from (its chat path, the client's)."""
    if value is None:
        return [], {}, (), []
    tools: list[dict[str, Any]] = []
    names: dict[str, tuple[str, str]] = {}
    dropped: list[str] = []
    sources: list[tuple[str, str]] = []

    def add(path: str, tool: Mapping[str, Any], name: str) -> None:
        chat = f"tools[{len(tools)}]"
        sources.extend(((f"{chat}.function", path), (chat, path)))
        tools.append(_function(path, tool, name))

    for i, tool in enumerate(array("tools", value)):
        path = f"tools[{i}]"
        tool = json_object(path, tool)
        kind = string(f"{path}.type", required(tool, "type", path))
        if kind == "function":
            add(path, tool, string(f"{path}.name", required(tool, "name", path)))
        elif kind == "namespace":
            namespace = string(f"{path}.name", required(tool, "name", path))
            for j, inner in enumerate(array(f"{path}.tools", required(tool, "tools", path))):
                inner_path = f"{path}.tools[{j}]"
                inner = json_object(inner_path, inner)
                inner_name = string(f"{inner_path}.name", required(inner, "name", inner_path))
                if inner.get("type") != "function":
                    dropped.append(_tool_type(inner.get("type")))
                    continue
                flat = flat_name(namespace, inner_name)
                names[flat] = (namespace, inner_name)
                add(inner_path, inner, flat)
        elif builtin_tools == "refuse":
            raise UnsupportedParameter(
                f"'{kind}' tools are not supported by this alias (builtin_tools = \"refuse\"); "
                "only 'function' and 'namespace' tools are",
                param=f"{path}.type",
            )
        else:
            dropped.append(_tool_type(kind))
    return tools, names, tuple(dropped), sources


def _tool_type(kind: object) -> str:
    """A dropped tool as the header and the metric name it: a type the API has, or "other"
    (a client's own string never reaches a header or a label)."""
    return kind if isinstance(kind, str) and kind in BUILTIN_TOOL_TYPES else "other"


def _tool_choice(choice: object) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return enum_value("tool_choice", choice, ("none", "auto", "required"))
    choice = json_object("tool_choice", choice)
    if choice.get("type") == "function":
        name = string("tool_choice.name", required(choice, "name", "tool_choice"))
        return {"type": "function", "function": {"name": name}}
    raise UnsupportedParameter(
        "tool_choice of this type is not supported by the gateway; use 'none', 'auto', "
        "'required' or a named function",
        param="tool_choice.type",
    )


def _text_format(value: object) -> dict[str, Any] | None:
    spec = json_object("text.format", value)
    kind = enum_value(
        "text.format.type",
        required(spec, "type", "text.format"),
        ("text", "json_object", "json_schema"),
    )
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    schema: dict[str, Any] = {
        "name": string("text.format.name", required(spec, "name", "text.format")),
        "schema": json_object("text.format.schema", required(spec, "schema", "text.format")),
    }
    for field in ("description", "strict"):
        if spec.get(field) is not None:
            schema[field] = spec[field]
    return {"type": "json_schema", "json_schema": schema}
