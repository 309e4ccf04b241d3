"""Gateway events → the Responses API's answer: its stream of events, and the ``response``
object they build. Pure.

One :class:`ResponseWriter` serves both: streamed, :meth:`encode` returns each event's SSE
bytes (``event: <type>`` then ``data: <json>``, every event with its ``sequence_number``, no
``[DONE]``: the stream ends with ``response.completed``, ``response.incomplete`` or
``response.failed``); whole, the same state is read once with :meth:`result`.

Output items, in the order the model wrote them (docs/api.md has the table):

- reasoning: a ``reasoning`` item, its text as ``reasoning_text`` content
  (``response.reasoning_text.*``), or as a summary (``response.reasoning_summary_*``) when the
  request asked for one (``reasoning.summary``: the model's own thinking is the best summary
  the gateway has). The vendor's signed thinking (``ReasoningDetail``) is sealed into the item's
  ``encrypted_content``; signatures that come once the reasoning item is closed (Gemini's, on a
  function call) go into one more reasoning item at the end of the answer.
- text: a ``message`` item with one ``output_text`` part. Whitespace before anything else is
  held back: Qwen3 writes ``"\\n\\n"`` after its thinking, before a tool call (which is no
  message) or its answer (whose text starts after it).
- tool calls: ``function_call`` items; a namespaced function (``responses_request.flat_name``)
  is named back as its namespace and name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from trio_gateway.core.errors import GatewayError
from trio_gateway.core.events import (
    ErrorEvent,
    Event,
    ReasoningDelta,
    ReasoningDetail,
    ResponseCancelled,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.reasoning_details import detail_object
from trio_gateway.core.sse import encode_event
from trio_gateway.fronts.openai_chunks import dumps

# Finish reasons that leave the answer incomplete, and the reason the API names.
INCOMPLETE: Final = {"length": "max_output_tokens", "content_filter": "content_filter"}
# The gateway's codes in a failed response, as the API spells them: its rate limit, and the
# context overflow Codex tells its user about (the API sends it, though the SDK's type does not
# list it); any other failure is the API's "server_error" (the message says which).
ERROR_CODES: Final = {
    "rate_limited": "rate_limit_exceeded",
    "quota_exhausted": "insufficient_quota",
    "context_length_exceeded": "context_length_exceeded",
}


def error_code(code: str) -> str:
    return ERROR_CODES.get(code, "server_error")


Seal = Callable[[list[dict[str, Any]]], str]
# How one event is written: as SSE (``event:`` and ``data:`` lines; the default), or as a
# WebSocket's message (which the socket takes, and nothing is returned).
Frame = Callable[[dict[str, Any]], bytes]
# Told the final response (completed or incomplete) before it is written; False: it will not be
# stored after all, and the response says so (``store: false``).
Keep = Callable[[dict[str, Any]], bool]


def sse_frame(event: dict[str, Any]) -> bytes:
    return encode_event(dumps(event), event["type"])


def usage_object(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        # cache_write_tokens: the SDK's type requires it; the events do not count it.
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens or 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
        "total_tokens": usage.total_tokens,
    }


class ResponseWriter:
    """Events → the Responses stream (``streaming``) and the final ``response`` object."""

    def __init__(
        self,
        *,
        response_id: str,
        created_at: int,
        model: str,
        echo: Mapping[str, Any],
        summary: bool,
        tool_names: Mapping[str, tuple[str, str]],
        seal: Seal,
        streaming: bool,
        seal_always: bool = False,
        keep: Keep | None = None,
        frame: Frame | None = None,
    ) -> None:
        self.id = response_id
        self._frame = frame or sse_frame
        self._base = response_id.removeprefix("resp_")
        self._meta: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": created_at,
            "model": model,
            "background": False,
            "error": None,
            "incomplete_details": None,
            **echo,
        }
        self._summary = summary
        self._tool_names = tool_names
        self._seal = seal
        self._seal_always = seal_always
        self._streaming = streaming
        self._keep = keep
        self._sequence = 0
        self._started = False
        self.status = "in_progress"
        self.output: list[dict[str, Any]] = []
        self._index: dict[str, int] = {}  # item id → its output_index
        self._open: dict[str, Any] | None = None  # the item being written
        self._text: list[str] = []  # the open item's text (message or reasoning)
        self._details: list[dict[str, Any]] = []  # the open reasoning item's signed thinking
        self._late: list[dict[str, Any]] = []  # signed thinking that came after its item
        self._held = ""  # leading whitespace, not yet a message
        self._calls: dict[int, dict[str, Any]] = {}  # tool call index → its item, while open
        self._usage: Usage | None = None
        self._error: dict[str, Any] | None = None
        self._incomplete: str | None = None
        self.finish_reason: str | None = None

    # --- the stream ------------------------------------------------------------------------
    def _emit(self, kind: str, payload: dict[str, Any]) -> bytes:
        if not self._streaming:
            return b""
        event = {"type": kind, **payload, "sequence_number": self._sequence}
        self._sequence += 1
        return self._frame(event)

    def take_sequence_number(self) -> int:
        """The next sequence number, for an event of this response's written beside its
        stream (a WebSocket's ``response.steer.failed``)."""
        self._sequence += 1
        return self._sequence - 1

    def response(self) -> dict[str, Any]:
        """The ``response`` object as it stands."""
        body = dict(self._meta)
        body["status"] = self.status
        body["output"] = list(self.output)
        body["usage"] = usage_object(self._usage)
        if self._error is not None:
            body["error"] = self._error
        if self._incomplete is not None:
            body["incomplete_details"] = {"reason": self._incomplete}
        return body

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        snapshot = self.response()
        return self._emit("response.created", {"response": snapshot}) + self._emit(
            "response.in_progress", {"response": snapshot}
        )

    def encode(self, event: Event) -> bytes:
        out = self._start()
        if type(event) is TextDelta:
            return out + self._text_delta(event.text)
        if type(event) is ReasoningDelta:
            return out + self._reasoning_delta(event.text)
        if isinstance(event, ReasoningDetail):
            return out + self._detail(event)
        if isinstance(event, ToolCallDelta):
            return out + self._call_delta(event)
        if isinstance(event, ToolCallDone):
            return out + self._call_done(event)
        if isinstance(event, Usage):
            self._usage = event
            return out
        if isinstance(event, ResponseDone):
            return out + self._done(event.finish_reason)
        if isinstance(event, ErrorEvent):
            return out + self._failed(error_code(event.code), event.message)
        if isinstance(event, ResponseStarted | ResponseCancelled):
            return out
        raise TypeError(f"unknown event {event!r}")

    def add(self, event: Event) -> None:
        self.encode(event)

    def result(self) -> dict[str, Any]:
        return self.response()

    def fail(self, error: GatewayError) -> bytes:
        """An error once the stream began: ``response.failed`` (the stream's last event); a
        ``block`` output filter ends the answer as the API ends a filtered one: incomplete,
        for ``content_filter``."""
        out = self._start()
        if error.code == "content_filtered":
            return out + self._done("content_filter")
        return out + self._failed(error_code(error.code), f"{error.message} ({error.code})")

    # --- items -----------------------------------------------------------------------------
    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self._base}_{len(self.output)}"

    def _add_item(self, item: dict[str, Any]) -> bytes:
        out = self._close()
        self._index[item["id"]] = len(self.output)
        self.output.append(item)
        self._open = item
        self._text = []
        return out + self._emit(
            "response.output_item.added", {"output_index": len(self.output) - 1, "item": item}
        )

    def _where(self, item: Mapping[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self._index[item["id"]]}

    def _close(self, status: str = "completed", *, calls: bool = False) -> bytes:
        """Ends the open item (its last events, then ``response.output_item.done``). A tool
        call stays open until its ``ToolCallDone`` (a provider may send them all at the end),
        unless ``calls``: the answer ended without it."""
        item, self._open = self._open, None
        if item is None or (item["type"] == "function_call" and not calls):
            return b""
        out = b""
        where = self._where(item)
        text = "".join(self._text)
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out += self._emit(
                "response.output_text.done",
                {**where, "content_index": 0, "text": text, "logprobs": []},
            )
            out += self._emit(
                "response.content_part.done", {**where, "content_index": 0, "part": part}
            )
            item["content"] = [part]
        elif item["type"] == "reasoning":
            if self._summary and self._text:
                part = {"type": "summary_text", "text": text}
                out += self._emit(
                    "response.reasoning_summary_text.done",
                    {**where, "summary_index": 0, "text": text},
                )
                out += self._emit(
                    "response.reasoning_summary_part.done",
                    {**where, "summary_index": 0, "part": part},
                )
                item["summary"] = [part]
            elif self._text:
                part = {"type": "reasoning_text", "text": text}
                out += self._emit(
                    "response.reasoning_text.done", {**where, "content_index": 0, "text": text}
                )
                out += self._emit(
                    "response.content_part.done", {**where, "content_index": 0, "part": part}
                )
                item["content"] = [part]
            if self._details or self._seal_always:
                item["encrypted_content"] = self._seal(self._details)
                self._details = []
        elif item["type"] == "function_call":
            # Closed by its ToolCallDone, or here if none came (the answer was cut).
            self._calls = {i: c for i, c in self._calls.items() if c is not item}
            status = "incomplete"
            out += self._emit(
                "response.function_call_arguments.done",
                {**where, "name": item["name"], "arguments": item["arguments"]},
            )
        item["status"] = status
        self._text = []
        return out + self._emit(
            "response.output_item.done", {"output_index": where["output_index"], "item": item}
        )

    def _text_delta(self, text: str) -> bytes:
        out = b""
        if self._open is None or self._open["type"] != "message":
            if not text.strip():
                self._held += text
                return b""
            # Whitespace between thinking and the answer is the </think> tag's separator.
            after_thinking = bool(self.output) and self.output[-1]["type"] == "reasoning"
            text, self._held = (text.lstrip() if after_thinking else self._held + text), ""
            item = {
                "id": self._item_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            out += self._add_item(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._emit(
                "response.content_part.added",
                {**self._where(item), "content_index": 0, "part": part},
            )
        assert self._open is not None
        self._text.append(text)
        return out + self._emit(
            "response.output_text.delta",
            {**self._where(self._open), "content_index": 0, "delta": text, "logprobs": []},
        )

    def _open_reasoning(self) -> bytes:
        item: dict[str, Any] = {"id": self._item_id("rs"), "type": "reasoning", "summary": []}
        return self._add_item(item)

    def _reasoning_delta(self, text: str) -> bytes:
        out = b""
        if self._open is None or self._open["type"] != "reasoning":
            out += self._open_reasoning()
        item = self._open
        assert item is not None
        where = self._where(item)
        if not self._text:
            if self._summary:
                part = {"type": "summary_text", "text": ""}
                out += self._emit(
                    "response.reasoning_summary_part.added",
                    {**where, "summary_index": 0, "part": part},
                )
            else:
                part = {"type": "reasoning_text", "text": ""}
                out += self._emit(
                    "response.content_part.added", {**where, "content_index": 0, "part": part}
                )
        self._text.append(text)
        if self._summary:
            return out + self._emit(
                "response.reasoning_summary_text.delta",
                {**where, "summary_index": 0, "delta": text},
            )
        return out + self._emit(
            "response.reasoning_text.delta", {**where, "content_index": 0, "delta": text}
        )

    def _detail(self, detail: ReasoningDetail) -> bytes:
        entry = detail_object(detail)
        if self._open is not None and self._open["type"] == "reasoning":
            self._details.append(entry)
            return b""
        if self._open is None and not self.output:
            # Thinking with no text of its own (Anthropic's redacted_thinking): its own item.
            out = self._open_reasoning()
            self._details.append(entry)
            return out
        self._late.append(entry)
        return b""

    def _call_item(self, index: int, call_id: str | None, name: str | None) -> bytes:
        flat = name or ""
        item: dict[str, Any] = {
            "id": self._item_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id or "",
            "name": flat,
            "arguments": "",
        }
        if flat in self._tool_names:
            item["namespace"], item["name"] = self._tool_names[flat]
        out = self._add_item(item)
        self._calls[index] = item
        return out

    def _call_delta(self, event: ToolCallDelta) -> bytes:
        out = b""
        item = self._calls.get(event.index)
        if item is None:
            out += self._call_item(event.index, event.id, event.name)
            item = self._calls[event.index]
        if not event.arguments:
            return out
        item["arguments"] += event.arguments
        return out + self._emit(
            "response.function_call_arguments.delta",
            {**self._where(item), "delta": event.arguments},
        )

    def _call_done(self, event: ToolCallDone) -> bytes:
        out = b""
        item = self._calls.get(event.index)
        if item is None:
            out += self._call_item(event.index, event.id, event.name)
            item = self._calls[event.index]
        item["arguments"] = event.arguments_raw
        item["call_id"] = item["call_id"] or event.id
        del self._calls[event.index]
        where = self._where(item)
        out += self._emit(
            "response.function_call_arguments.done",
            {**where, "name": item["name"], "arguments": event.arguments_raw},
        )
        # Arguments that do not parse were cut (max_output_tokens) or never finished: the
        # item is incomplete, as the answer will be, and a client does not run it as whole.
        item["status"] = "completed" if event.arguments_valid else "incomplete"
        if self._open is item:
            self._open = None
        return out + self._emit(
            "response.output_item.done", {"output_index": where["output_index"], "item": item}
        )

    def _end_items(self, status: str) -> bytes:
        out = self._close(status)
        for item in list(self._calls.values()):
            self._open = item
            out += self._close(status, calls=True)
        if self._late:
            out += self._open_reasoning()
            self._details, self._late = self._late, []
            out += self._close()
        return out

    def _done(self, finish_reason: str) -> bytes:
        self.finish_reason = finish_reason
        self._incomplete = INCOMPLETE.get(finish_reason)
        out = self._end_items("incomplete" if self._incomplete else "completed")
        self.status = "completed" if self._incomplete is None else "incomplete"
        if self._keep is not None and not self._keep(self.response()):
            self._meta["store"] = False
        return out + self._emit(f"response.{self.status}", {"response": self.response()})

    def _failed(self, code: str, message: str) -> bytes:
        out = self._end_items("incomplete")
        self.status = "failed"
        self._error = {"code": code, "message": message}
        return out + self._emit("response.failed", {"response": self.response()})
