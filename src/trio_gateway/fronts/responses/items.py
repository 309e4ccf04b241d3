"""A Responses body's input items as chat messages, and each item as the gateway keeps it for a
stored response. Pure.

Everything between two inputs of the client (a user, system or developer message, a
``function_call_output``) is one assistant turn: its ``reasoning`` items' sealed
``encrypted_content`` becomes the turn's ``reasoning_details``, its output text the content,
its ``function_call`` items the tool calls. An ``item_reference`` (``{"type":
"item_reference", "id"}``, or an item with only an ``id``) stands for an output item of one of
the key's stored responses, resolved before (``references``; the route reads them from the
store): it is read, and kept, as that item.

What is kept is what the gateway used, in the API's shape: a message, a call, a call's output
as the text the model got, a reasoning item the gateway could open. Items it drops (built-in
tools' calls, reasoning sealed elsewhere) are counted and not kept.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.validation_values import (
    enum_value,
    json_object,
    required,
    string,
    wrong_type,
)

Opener = Callable[[str], list[dict[str, Any]] | None]
Item = dict[str, Any]

INPUT_ROLES: Final = ("user", "system", "developer", "assistant")
IMAGE_DETAILS: Final = ("auto", "low", "high", "original")
MAX_TOOL_NAME: Final = 64
_NOT_NAME: Final = re.compile(r"[^a-zA-Z0-9_-]")


def flat_name(namespace: str, name: str) -> str:
    """A namespace's function as one chat function name, within OpenAI's name rules."""
    joined = namespace + name if namespace.endswith("__") else f"{namespace}__{name}"
    flat = _NOT_NAME.sub("_", joined)
    if len(flat) > MAX_TOOL_NAME:
        digest = hashlib.sha256(joined.encode()).hexdigest()[:8]
        flat = f"{flat[: MAX_TOOL_NAME - 9]}_{digest}"
    return flat


def item_not_found(item_id: str) -> InvalidRequest:
    """The API's answer to a reference it holds no item for."""
    return InvalidRequest(
        f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to "
        "false. Try again with `store` set to true, or remove this item from your input.",
        param="input",
    )


def item_kind(path: str, item: Mapping[str, Any]) -> str:
    """An item's type; without one, a message, or (an ``id`` and no ``role``) a reference."""
    kind = item.get("type")
    if kind is None:
        return "item_reference" if "id" in item and "role" not in item else "message"
    return string(f"{path}.type", kind)


def input_items(value: object) -> list[Item]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise wrong_type("input", "one of a string or array of input items", value)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise wrong_type(f"input[{i}]", "an input item", item)
    return value


def references(value: object) -> list[str]:
    """The ids an input's ``item_reference`` items name, for the caller to resolve (a body
    whose input is malformed names none: its parsing says what is wrong)."""
    if not isinstance(value, list):
        return []
    found = []
    for item in value:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            kind = item.get("type")
            if kind == "item_reference" or (kind is None and "role" not in item):
                found.append(item["id"])
    return found


@attrs.frozen(kw_only=True)
class Prefix:
    """What :class:`Turns` made of a conversation's items so far (``previous_response_id``'s
    history), to go on from without reading them again: its messages and their sources, the
    assistant turn still open at its end, what it dropped, and how many items it read (the
    next item's index in ``previous_response.items``). Shares the messages it made with the
    chat bodies they went into: nothing changes a chat body's messages once made (a provider
    copies what it leaves out: ``providers/translate.py``)."""

    messages: tuple[dict[str, Any], ...]
    sources: tuple[str, ...]
    text: tuple[str, ...]
    calls: tuple[dict[str, Any], ...]
    details: tuple[dict[str, Any], ...]
    turn_source: str | None
    dropped: tuple[str, ...]
    items: int
    # A call in a namespace was read: its chat name came from that body's tools, so the prefix
    # holds for that body alone (``prefixes.py`` keeps none such).
    namespaced: bool


HISTORY_PATH: Final = "previous_response.items"


class Turns:
    """Input items → chat messages, one assistant message per turn of the model's; and the
    path of what each message was made from (``sources``), to name a chat error's param as the
    client sent it."""

    def __init__(
        self,
        tool_names: Mapping[str, tuple[str, str]],
        opener: Opener,
        dropped: list[str],
        referenced: Mapping[str, Item],
    ) -> None:
        self._flat = {pair: flat for flat, pair in tool_names.items()}
        self._opener = opener
        self._dropped = dropped
        self._referenced = referenced
        self.messages: list[dict[str, Any]] = []
        self.sources: list[str] = []
        self._text: list[str] = []
        self._calls: list[dict[str, Any]] = []
        self._details: list[dict[str, Any]] = []
        self._turn_source: str | None = None  # the first item of the open assistant turn
        self.namespaced = False  # a call in a namespace was read (:class:`Prefix`)

    def add(self, path: str, item: Mapping[str, Any], *, reference: bool = True) -> Item | None:
        """Reads one item into the conversation; returns it as the gateway keeps it, or None
        when it is dropped. ``reference``: whether the item may be an ``item_reference``."""
        kind = item_kind(path, item)
        if kind == "item_reference" and reference:
            item_id = string(f"{path}.id", required(item, "id", path))
            found = self._referenced.get(item_id)
            if found is None:
                raise item_not_found(item_id)
            return self.add(path, found, reference=False)
        if kind == "message":
            return self._message(path, item)
        if kind == "function_call":
            return self._call(path, item)
        if kind == "function_call_output":
            self._end_turn()
            call_id = string(f"{path}.call_id", required(item, "call_id", path))
            output = _output_text(f"{path}.output", required(item, "output", path))
            if output is None:
                self._dropped.append("tool_output_image")
                output = ""
            self._append(path, {"role": "tool", "tool_call_id": call_id, "content": output})
            return {"type": "function_call_output", "call_id": call_id, "output": output}
        if kind == "reasoning":
            return self._reasoning(path, item)
        # Built-in tools' calls and outputs (web_search_call...): nothing a chat model reads.
        self._dropped.append("input_item")
        return None

    def history(self, items: Sequence[Mapping[str, Any]], prefix: Prefix | None = None) -> int:
        """Reads a conversation's earlier items (never references), after ``prefix``'s, each
        named by its index in the whole history; the items read in all."""
        start = 0
        if prefix is not None:
            self.messages += prefix.messages
            self.sources += prefix.sources
            self._text, self._calls = list(prefix.text), list(prefix.calls)
            self._details, self._turn_source = list(prefix.details), prefix.turn_source
            self._dropped += prefix.dropped
            self.namespaced = prefix.namespaced
            start = prefix.items
        for i, item in enumerate(items, start):
            self.add(f"{HISTORY_PATH}[{i}]", item, reference=False)
        return start + len(items)

    def snapshot(self, first: int, dropped_from: int, items: int) -> Prefix:
        """The conversation read so far, from message ``first`` on (those before it are not
        history: the instructions) and the drops from ``dropped_from`` on, as a
        :class:`Prefix` of ``items`` items."""
        return Prefix(
            messages=tuple(self.messages[first:]),
            sources=tuple(self.sources[first:]),
            text=tuple(self._text),
            calls=tuple(self._calls),
            details=tuple(self._details),
            turn_source=self._turn_source,
            dropped=tuple(self._dropped[dropped_from:]),
            items=items,
            namespaced=self.namespaced,
        )

    def _message(self, path: str, item: Mapping[str, Any]) -> Item:
        role = enum_value(f"{path}.role", required(item, "role", path), INPUT_ROLES)
        content = required(item, "content", path)
        kept: Item = {"type": "message", "role": role, "content": content}
        if role == "assistant":
            self._open_turn(path)
            self._text.append(_text_of(f"{path}.content", content))
            return kept
        self._end_turn()
        if role == "user":
            self._append(path, {"role": "user", "content": _user_content(path, content)})
        else:
            # developer is OpenAI's newer name for system; not every vendor knows it.
            text = _text_of(f"{path}.content", content)
            self._append(path, {"role": "system", "content": text})
        return kept

    def _call(self, path: str, item: Mapping[str, Any]) -> Item:
        name = string(f"{path}.name", required(item, "name", path))
        call_id = string(f"{path}.call_id", required(item, "call_id", path))
        # Sent back as the model wrote it: never replaced by something else.
        arguments = string(f"{path}.arguments", required(item, "arguments", path))
        kept: Item = {"type": "function_call", "call_id": call_id, "name": name}
        namespace = item.get("namespace")
        if namespace is not None:
            namespace = string(f"{path}.namespace", namespace)
            kept["namespace"] = namespace
            self.namespaced = True
            name = self._flat.get((namespace, name), flat_name(namespace, name))
        kept["arguments"] = arguments
        self._open_turn(path)
        self._calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
        return kept

    def _reasoning(self, path: str, item: Mapping[str, Any]) -> Item | None:
        # Part of the model's turn wherever it stands in it: the gateway writes signatures that
        # come after a call (Gemini's) in a reasoning item after that call.
        sealed = item.get("encrypted_content")
        if sealed is None:
            return None  # its text alone: no vendor takes it back
        sealed = string(f"{path}.encrypted_content", sealed)
        details = self._opener(sealed)
        if details is None:
            self._dropped.append("reasoning_unopened")
            return None
        if not details:
            return None  # sealed because the client asked for it: nothing a vendor takes back
        self._open_turn(path)
        self._details += details
        return {"type": "reasoning", "summary": [], "encrypted_content": sealed}

    def _open_turn(self, path: str) -> None:
        if self._turn_source is None:
            self._turn_source = path

    def _append(self, path: str, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.sources.append(path)

    def _end_turn(self) -> None:
        text = "".join(self._text)
        if text or self._calls:
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if self._calls:
                message["tool_calls"] = self._calls
            if self._details:
                message["reasoning_details"] = self._details
            self._append(self._turn_source or "input", message)
        self._text, self._calls, self._details = [], [], []
        self._turn_source = None

    def finish(self) -> list[dict[str, Any]]:
        self._end_turn()
        return self.messages


def _text_of(path: str, content: object) -> str:
    """A system, developer or assistant message's content as one string."""
    if isinstance(content, str):
        return content
    parts = _content_parts(path, content)
    texts = []
    for i, part in enumerate(parts):
        part = json_object(f"{path}[{i}]", part)
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            texts.append(string(f"{path}[{i}].text", required(part, "text", f"{path}[{i}]")))
        elif kind == "refusal":
            texts.append(string(f"{path}[{i}].refusal", required(part, "refusal", f"{path}[{i}]")))
        else:
            raise InvalidRequest(
                f"Invalid value for '{path}[{i}].type': this role's content takes text parts "
                "('input_text', 'output_text')",
                param=f"{path}[{i}].type",
            )
    return "".join(texts)


def _content_parts(path: str, content: object) -> list[Any]:
    if not isinstance(content, list):
        raise wrong_type(path, "one of a string or array of objects", content)
    return content


def _user_content(path: str, content: object) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    content_path = f"{path}.content"
    for i, part in enumerate(_content_parts(content_path, content)):
        part_path = f"{content_path}[{i}]"
        part = json_object(part_path, part)
        kind = string(f"{part_path}.type", required(part, "type", part_path))
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
            if part.get("detail") is not None:
                image["detail"] = enum_value(f"{part_path}.detail", part["detail"], IMAGE_DETAILS)
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            data = part.get("file_data")
            if not isinstance(data, str):
                raise UnsupportedParameter(
                    "an 'input_file' needs its 'file_data'; file ids and URLs are not supported "
                    "by the gateway",
                    param=f"{part_path}.file_data",
                )
            filename = part.get("filename")
            name = string(f"{part_path}.filename", filename) if filename is not None else "file"
            parts.append({"type": "file", "file": {"file_data": data, "filename": name or "file"}})
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
    for i, part in enumerate(_content_parts(path, output)):
        part = json_object(f"{path}[{i}]", part)
        if part.get("type") in ("input_text", "output_text"):
            texts.append(string(f"{path}[{i}].text", required(part, "text", f"{path}[{i}]")))
    return "".join(texts) if texts else None
