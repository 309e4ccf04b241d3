"""Server-sent events: an incremental decoder and the encoder, with no I/O.

The decoder splits the *byte* stream on CR/LF before anything is decoded, so a multi-byte
character cut across network reads is never seen in halves, and Unicode line separators
(U+2028, U+0085, ...) inside a JSON string are ordinary characters, not line ends
(``str.splitlines`` would break them).
"""

from __future__ import annotations

import json

import attrs
import msgspec


@attrs.frozen(slots=True)
class SSEEvent:
    data: bytes
    event: str | None = None
    id: str | None = None


class SSEDecodeError(Exception):
    """The stream broke the limits the decoder was given."""


class SSEDecoder:
    """Feed bytes as they arrive; get back the complete events.

    ``max_line_bytes`` bounds the memory one unterminated line may take, and
    ``max_event_bytes`` the data of one event that never ends (``data:`` lines with no blank
    line after them): together, what the decoder keeps is at most their sum.
    """

    def __init__(self, *, max_line_bytes: int = 1 << 20, max_event_bytes: int = 1 << 20) -> None:
        self._max_line_bytes = max_line_bytes
        self._max_event_bytes = max_event_bytes
        self._buffer = b""
        self._skip_lf = False  # the last chunk ended in CR: a following LF belongs to it
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._event: str | None = None
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        if not chunk:
            return []
        buffer = self._buffer + chunk if self._buffer else chunk
        events: list[SSEEvent] = []
        if b"\r" not in buffer:
            # The common case (vLLM, OpenAI): LF only.
            lines = buffer.split(b"\n")
        else:
            if buffer.endswith(b"\r"):
                self._skip_lf = True
            lines = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._buffer = lines.pop()
        if len(self._buffer) > self._max_line_bytes:
            raise SSEDecodeError(f"an SSE line exceeded {self._max_line_bytes} bytes")
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: a last event not followed by a blank line is still dispatched."""
        events = []
        if self._buffer:
            event = self._line(self._buffer)
            self._buffer = b""
            if event is not None:
                events.append(event)
        event = self._line(b"")
        if event is not None:
            events.append(event)
        return events

    def _line(self, line: bytes) -> SSEEvent | None:
        if not line:
            if not self._data:
                self._event = None
                return None
            event = SSEEvent(
                data=b"\n".join(self._data) if len(self._data) > 1 else self._data[0],
                event=self._event,
                id=self._id,
            )
            self._data = []
            self._data_bytes = 0
            self._event = None
            return event
        if line[:1] == b":":
            return None
        field, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            # Counted with the newline that will join it to the next line.
            self._data_bytes += len(value) + 1
            if self._data_bytes > self._max_event_bytes + 1:
                raise SSEDecodeError(f"an SSE event exceeded {self._max_event_bytes} bytes")
            self._data.append(value)
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
        elif field == b"id" and b"\0" not in value:
            self._id = value.decode("utf-8", "replace")
        return None


def encode_event(data: bytes, event: str | None = None) -> bytes:
    """One SSE event. ``data`` must not contain CR or LF (JSON text never does)."""
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


DONE = b"data: [DONE]\n\n"


_DECODER = json.JSONDecoder()  # stateless: one shared instance is safe
_FAST = msgspec.json.Decoder()  # likewise


def json_data(data: bytes) -> object:
    """An event's data as JSON, what ``json.loads`` returns or raises (ValueError) for it read
    as UTF-8, at about a third of its cost on the per-chunk path: msgspec (C, strict RFC 8259,
    integers of any size) reads what it can, and whatever it refuses (NaN, lone surrogates, a
    number past a double, text that is not UTF-8) is read by ``json`` as before, which accepts
    it or refuses it with its own message."""
    try:
        return _FAST.decode(data)
    except msgspec.DecodeError:
        pass
    text = data.decode()
    try:
        value, end = _DECODER.raw_decode(text)
    except ValueError:
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value
