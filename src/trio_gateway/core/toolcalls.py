"""Tool-call assembly: fragments in, whole calls out once the stream has finished."""

from __future__ import annotations

import json

from trio_gateway.core.events import ToolCallDelta, ToolCallDone


class ToolCallAssembler:
    """Collects ``ToolCallDelta`` fragments by index.

    Arguments are parsed only in :meth:`finish`: mid-stream they are rarely valid JSON, and a prefix
    that happens to parse (``{}`` of ``{}}``) must not be taken for the whole.
    """

    def __init__(self, *, max_argument_bytes: int = 1 << 20) -> None:
        self._max_argument_bytes = max_argument_bytes
        self._ids: dict[int, str] = {}
        self._names: dict[int, str] = {}
        self._arguments: dict[int, list[str]] = {}
        self._sizes: dict[int, int] = {}

    def __bool__(self) -> bool:
        return bool(self._arguments)

    def add(self, delta: ToolCallDelta) -> None:
        index = delta.index
        if index not in self._arguments:
            self._arguments[index] = []
            self._sizes[index] = 0
        if delta.id:
            self._ids.setdefault(index, delta.id)
        if delta.name and index not in self._names:
            self._names[index] = delta.name
        if delta.arguments:
            # Bytes, as the name says: a character of CJK or an emoji is 3-4 of them.
            self._sizes[index] += len(delta.arguments.encode("utf-8"))
            if self._sizes[index] > self._max_argument_bytes:
                raise ValueError(
                    f"tool call {index} arguments exceed {self._max_argument_bytes} bytes"
                )
            self._arguments[index].append(delta.arguments)

    def finish(self, *, fallback_id_prefix: str = "call") -> list[ToolCallDone]:
        done = []
        for index in sorted(self._arguments):
            raw = "".join(self._arguments[index])
            try:
                parsed = json.loads(raw) if raw.strip() else {}
                valid = True
            except ValueError:
                parsed, valid = raw, False
            done.append(
                ToolCallDone(
                    index=index,
                    id=self._ids.get(index, f"{fallback_id_prefix}_{index}"),
                    name=self._names.get(index, ""),
                    arguments=parsed,
                    arguments_raw=raw,
                    arguments_valid=valid,
                )
            )
        return done
