"""A Responses API body (``POST /v1/responses``) as the gateway's chat body. Pure.

The mapping is docs/api.md's table ("The Responses front"). In short: ``instructions`` is the
first system message; ``input`` items become chat messages, where everything between two
inputs of the client (a user, system or developer message, a ``function_call_output``) is one
assistant turn: its ``reasoning`` items' sealed ``encrypted_content`` becomes the turn's
``reasoning_details``, its output text the content, its ``function_call`` items the tool
calls. Function tools are unflattened to chat's ``{"type": "function", "function": ...}``;
a ``namespace`` tool's functions become functions named ``<namespace>__<name>`` (the answer
names them back, :attr:`ResponsesRequest.tool_names`); built-in tools are dropped or refused
per alias (``builtin_tools``).

Fields the gateway cannot honour are refused when dropping them would change the answer
(``conversation``, ``prompt``, ``background: true``); the others it does not use are dropped,
each named in :attr:`ResponsesRequest.dropped_fields` for the log and the metric.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

import attrs

from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.request import REASONING_EFFORTS
from trio_gateway.core.validation_values import (
    array,
    enum_value,
    json_object,
    required,
    string,
    wrong_type,
)

BuiltinTools = Literal["drop", "refuse"]
Opener = Callable[[str], list[dict[str, Any]] | None]

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
INPUT_ROLES: Final = ("user", "system", "developer", "assistant")
IMAGE_DETAILS: Final = ("auto", "low", "high")
MAX_TOOL_NAME: Final = 64
_NOT_NAME: Final = re.compile(r"[^a-zA-Z0-9_-]")


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
    tool_names: dict[str, tuple[str, str]]  # flattened name -> (namespace, name)
    input_items: list[dict[str, Any]]  # the input as items, for a stored response
    dropped_fields: tuple[str, ...]
    dropped_tools: tuple[str, ...]


def flat_name(namespace: str, name: str) -> str:
    """A namespace's function as one chat function name, within OpenAI's name rules."""
    joined = namespace + name if namespace.endswith("__") else f"{namespace}__{name}"
    flat = _NOT_NAME.sub("_", joined)
    if len(flat) > MAX_TOOL_NAME:
        digest = hashlib.sha256(joined.encode()).hexdigest()[:8]
        flat = f"{flat[: MAX_TOOL_NAME - 9]}_{digest}"
    return flat


def parse_responses_body(
    body: object,
    *,
    history: Sequence[Mapping[str, Any]] = (),
    opener: Opener,
    builtin_tools: BuiltinTools = "drop",
) -> ResponsesRequest:
    """The chat body a Responses body asks for; ``history`` the items of the response named
    by ``previous_response_id`` (its input and output), read before this input."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    dropped: list[str] = []
    for field in body:
        if field not in HANDLED and body[field] is not None:
            if field in REFUSED or (field == "background" and body[field] is True):
                raise UnsupportedParameter(
                    f"'{field}' is not supported by the gateway's Responses front", param=field
                )
            dropped.append(field if field in KNOWN_DROPPED else "other")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string (an alias)", param="model")
    chat: dict[str, Any] = {"model": model}
    echo: dict[str, Any] = {}

    tools, tool_names, dropped_tools = _tools(body.get("tools"), builtin_tools)
    items = _input_items(body.get("input"))
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        messages.append({"role": "system", "content": string("instructions", instructions)})
    turns = _Turns(tool_names, opener, dropped)
    for i, item in enumerate(history):
        turns.add(f"previous_response.items[{i}]", item)
    for i, item in enumerate(items):
        turns.add(f"input[{i}]", item)
    messages += turns.finish()
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
    summary = False
    reasoning = body.get("reasoning")
    if reasoning is not None:
        reasoning = json_object("reasoning", reasoning)
        effort = reasoning.get("effort")
        if effort is not None:
            chat["reasoning_effort"] = enum_value("reasoning.effort", effort, REASONING_EFFORTS)
        summary = reasoning.get("summary") not in (None, "none")
        if reasoning.get("generate_summary") is not None:
            dropped.append("reasoning.generate_summary")
    text = body.get("text")
    if text is not None:
        text = json_object("text", text)
        if text.get("format") is not None:
            response_format = _text_format(text["format"])
            if response_format is not None:
                chat["response_format"] = response_format
        if text.get("verbosity") is not None:
            dropped.append("text.verbosity")

    store = body.get("store") is not False
    previous = body.get("previous_response_id")
    if previous is not None:
        previous = string("previous_response_id", previous)
    session = body.get("prompt_cache_key")
    echo.update(
        instructions=instructions,
        max_output_tokens=body.get("max_output_tokens"),
        metadata=body.get("metadata") or {},
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        previous_response_id=previous,
        reasoning={
            "effort": (reasoning or {}).get("effort"),
            "summary": (reasoning or {}).get("summary"),
        },
        store=store,
        temperature=body.get("temperature"),
        text={"format": (text or {}).get("format") or {"type": "text"}},
        tool_choice=choice if choice is not None else "auto",
        tools=[t for t in body.get("tools") or () if t.get("type") not in BUILTIN_TOOL_TYPES],
        top_p=body.get("top_p"),
        user=body.get("user"),
        prompt_cache_key=session,
        truncation="disabled",
    )
    return ResponsesRequest(
        chat=chat,
        echo=echo,
        stream=stream,
        store=store,
        previous_response_id=previous,
        session=session if isinstance(session, str) and session.strip() else None,
        summary=summary,
        tool_names=tool_names,
        input_items=items,
        dropped_fields=tuple(dropped),
        dropped_tools=dropped_tools,
    )


def _input_items(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise wrong_type("input", "one of a string or array of objects", value)
    return [json_object(f"input[{i}]", item) for i, item in enumerate(value)]


class _Turns:
    """Input items → chat messages, one assistant message per turn of the model's."""

    def __init__(
        self, tool_names: Mapping[str, tuple[str, str]], opener: Opener, dropped: list[str]
    ) -> None:
        self._flat = {pair: flat for flat, pair in tool_names.items()}
        self._opener = opener
        self._dropped = dropped
        self._messages: list[dict[str, Any]] = []
        self._text: list[str] = []
        self._calls: list[dict[str, Any]] = []
        self._details: list[dict[str, Any]] = []

    def add(self, path: str, item: Mapping[str, Any]) -> None:
        kind = item.get("type", "message")
        if kind == "message":
            role = enum_value(f"{path}.role", required(item, "role", path), INPUT_ROLES)
            content = required(item, "content", path)
            if role == "assistant":
                self._text.append(_text_of(f"{path}.content", content))
                return
            self._end_turn()
            if role == "user":
                self._messages.append({"role": "user", "content": _user_content(path, content)})
            else:
                # developer is OpenAI's newer name for system; not every vendor knows it.
                text = _text_of(f"{path}.content", content)
                self._messages.append({"role": "system", "content": text})
        elif kind == "function_call":
            name = string(f"{path}.name", required(item, "name", path))
            namespace = item.get("namespace")
            if isinstance(namespace, str):
                name = self._flat.get((namespace, name), flat_name(namespace, name))
            arguments = item.get("arguments")
            self._calls.append(
                {
                    "id": string(f"{path}.call_id", required(item, "call_id", path)),
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": arguments if isinstance(arguments, str) else "{}",
                    },
                }
            )
        elif kind == "function_call_output":
            self._end_turn()
            call_id = string(f"{path}.call_id", required(item, "call_id", path))
            output = _output_text(f"{path}.output", required(item, "output", path))
            if output is None:
                self._dropped.append("tool_output_image")
                output = ""
            self._messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            # Part of the model's turn wherever it stands in it: the gateway writes signatures
            # that come after a call (Gemini's) in a reasoning item after that call.
            sealed = item.get("encrypted_content")
            if isinstance(sealed, str):
                details = self._opener(sealed)
                if details is None:
                    self._dropped.append("reasoning_unopened")
                else:
                    self._details += details
        elif kind == "item_reference":
            raise UnsupportedParameter(
                "'item_reference' items are not supported; send the items themselves or use "
                "'previous_response_id'",
                param=f"{path}.type",
            )
        else:
            # Built-in tools' calls and outputs (web_search_call...): nothing a chat model reads.
            self._dropped.append("input_item")

    def _end_turn(self) -> None:
        text = "".join(self._text)
        if text or self._calls:
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if self._calls:
                message["tool_calls"] = self._calls
            if self._details:
                message["reasoning_details"] = self._details
            self._messages.append(message)
        self._text, self._calls, self._details = [], [], []

    def finish(self) -> list[dict[str, Any]]:
        self._end_turn()
        return self._messages


def _text_of(path: str, content: object) -> str:
    """A system, developer or assistant message's content as one string."""
    if isinstance(content, str):
        return content
    parts = array(path, content)
    texts = []
    for i, part in enumerate(parts):
        part = json_object(f"{path}[{i}]", part)
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            texts.append(string(f"{path}[{i}].text", required(part, "text", f"{path}[{i}]")))
        elif kind == "refusal":
            texts.append(str(part.get("refusal") or ""))
        else:
            raise InvalidRequest(
                f"Invalid value for '{path}[{i}].type': this role's content takes text parts "
                "('input_text', 'output_text')",
                param=f"{path}[{i}].type",
            )
    return "".join(texts)


def _user_content(path: str, content: object) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    content_path = f"{path}.content"
    for i, part in enumerate(array(content_path, content)):
        part_path = f"{content_path}[{i}]"
        part = json_object(part_path, part)
        kind = required(part, "type", part_path)
        if kind in ("input_text", "output_text"):
            text = string(f"{part_path}.text", required(part, "text", part_path))
            parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise UnsupportedParameter(
                    "an 'input_image' needs an 'image_url' (a URL or a data URL); file ids are "
                    "not supported by the gateway",
                    param=f"{part_path}.image_url",
                )
            image: dict[str, Any] = {"url": url}
            if part.get("detail") in IMAGE_DETAILS:
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            data = part.get("file_data")
            if not isinstance(data, str):
                raise UnsupportedParameter(
                    "an 'input_file' needs its 'file_data'; file ids and URLs are not supported "
                    "by the gateway",
                    param=f"{part_path}.file_data",
                )
            file = {"file_data": data, "filename": str(part.get("filename") or "file")}
            parts.append({"type": "file", "file": file})
        else:
            raise InvalidRequest(
                f"Invalid value for '{part_path}.type': expected one of 'input_text', "
                "'input_image' or 'input_file'",
                param=f"{part_path}.type",
            )
    return parts


def _output_text(path: str, output: object) -> str | None:
    """A function call's output as the tool message's text; None when it held only parts a
    tool message cannot carry (images, files)."""
    if isinstance(output, str):
        return output
    texts = []
    for i, part in enumerate(array(path, output)):
        part = json_object(f"{path}[{i}]", part)
        if part.get("type") in ("input_text", "output_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "".join(texts) if texts else None


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
) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]], tuple[str, ...]]:
    """Chat tools, the flattened names of namespaced functions, and the built-in tools dropped."""
    if value is None:
        return [], {}, ()
    tools: list[dict[str, Any]] = []
    names: dict[str, tuple[str, str]] = {}
    dropped: list[str] = []
    for i, tool in enumerate(array("tools", value)):
        path = f"tools[{i}]"
        tool = json_object(path, tool)
        kind = string(f"{path}.type", required(tool, "type", path))
        if kind == "function":
            name = string(f"{path}.name", required(tool, "name", path))
            tools.append(_function(path, tool, name))
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
                tools.append(_function(inner_path, inner, flat))
        elif builtin_tools == "refuse":
            raise UnsupportedParameter(
                f"'{kind}' tools are not supported by this alias (builtin_tools = \"refuse\"); "
                "only 'function' and 'namespace' tools are",
                param=f"{path}.type",
            )
        else:
            dropped.append(_tool_type(kind))
    return tools, names, tuple(dropped)


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
