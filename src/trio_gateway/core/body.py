"""A client's JSON text read as RFC 8259 has it, and the bounds on a body every front shares.

Every front reads its body here (``request.read_chat_json``), and so does the WebSocket's
message codec: what is refused, and how it is worded, is the same on each.

- **What JSON is.** No ``NaN`` or ``Infinity``; no number a double or an int cannot hold
  (``1e400``, an integer past Python's ``int_max_str_digits``, 4,300 digits); no lone
  surrogate (``"\\ud800"``: half of a UTF-16 pair, which UTF-8 cannot encode, so no upstream
  could be sent it; OpenAI refuses it as invalid JSON too); text that is not UTF-8 (or UTF-16
  or 32, which ``json`` reads); nesting past the parser. Each refusal says where: line and
  column, as ``json`` says it. Duplicate keys are read as ``json`` reads them: the last wins
  (the body is serialized again for the provider, so no reader downstream sees the others).
- **Bounds.** :data:`MAX_CONTENT_PARTS`, messages and the parts of their content counted
  together, where a front says they are (:data:`CHAT_PARTS`, ...); nesting is bounded by
  ``validation.MAX_DEPTH``.

msgspec reads what it accepts (C, strict: the same values as ``json`` for every text it
accepts, at a half to a quarter of the cost); a text it refuses is read again by ``json``, which
says where a syntax error is, and a scan of its tokens finds the rest. Pure.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, Final, TypeAlias

import msgspec

from trio_gateway.core.validation import MAX_DEPTH
from trio_gateway.core.validation_values import invalid

# Messages and the parts of their content (text blocks, images, tool results), counted
# together, in one request. The cost of reading, checking, translating and filtering a body
# grows with them as much as with its bytes: a 4 MiB body of 130,000 text blocks took 1.9 s
# of CPU before it was refused. An agent's conversation near a 1M-token context carries a few
# thousand; a body past this is not a conversation.
MAX_CONTENT_PARTS: Final = 20_000

# Where a front's messages and their parts are: paths of keys from the body, "*" for every
# item of an array; the arrays found there are counted (their items, not what they hold).
PartPaths: TypeAlias = Sequence[Sequence[str]]
CHAT_PARTS: Final[PartPaths] = (("messages",), ("messages", "*", "content"))

# A text past this is read in pieces (:func:`_pieces`): msgspec reads 64 KiB in well under a
# millisecond, and 4 MiB of small objects in 60 to 300 ms (a loaded 2-core machine), all of
# it holding the GIL, which stops the event loop however the work is threaded.
PIECE_BYTES: Final = 64 * 1024
# Commas tried as the end of a piece of an array before the rest is read at once: a cut inside
# a long string full of commas fails, and each try reads the piece again.
MAX_CUTS_TRIED: Final = 16
# A big text (or piece) of at most this many objects (counted by their ``{``) is read whole
# all the same: objects are what msgspec spends its time on (130,000 small ones: 160 ms;
# 5,000: some 6 ms), while 4 MiB of text in 2,000 parts takes it 2 ms, and 128,000 token ids
# 5 ms (in pieces, 30 and 230 ms: each level read again, each item a call).
WHOLE_OBJECTS: Final = 5_000
# Pieces are cut down to this level (a part's text, in every front's shape, is at most
# seven deep); past it a value is read whole. Each level reads its bytes again.
MAX_PIECE_DEPTH: Final = 8
# Whitespace that may come before a value's first character, looked through.
_LEAD_BYTES: Final = 64


def _nothing() -> None:
    pass


# Called after each piece that held the GIL for a whole big text (a level of it): the shell
# that reads a body in a worker thread sets it to a short sleep (fronts/off_loop.py), so that
# the event loop's thread, which may have waited that long, runs at once, without the GIL's
# 5 ms of contention per turn. Nothing elsewhere (where it would sleep the loop itself).
BETWEEN_PIECES: ContextVar[Callable[[], None]] = ContextVar("between_pieces", default=_nothing)

_FAST = msgspec.json.Decoder()
_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
# Reads what msgspec refused, to say why: NaN and lone surrogates it takes, for the scan to
# place them. json.loads with any argument builds a decoder per call: this one is built once.
_LENIENT = json.JSONDecoder()
_UNREAD = object()

# JSON's tokens, enough to find what the scan refuses: strings (keys too), brackets, numbers,
# and the constants Python's json reads.
_TOKEN = re.compile(
    r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{]|[\]}]|NaN|-?Infinity|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?',
    re.DOTALL,
)
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)
_SURROGATE_CHAR = re.compile("[\ud800-\udfff]")
_HIGH = range(0xD800, 0xDC00)
_LOW = range(0xDC00, 0xE000)


class JSONRefused(ValueError):
    """A text that is not JSON as the gateway reads it: ``reason``, and where (``line`` and
    ``column`` from 1, as ``json.JSONDecodeError`` counts them) when a place is known."""

    def __init__(self, reason: str, text: str = "", pos: int | None = None) -> None:
        self.reason = reason
        self.pos = pos
        self.line = self.column = 0
        if pos is not None:
            self.line = text.count("\n", 0, pos) + 1
            self.column = pos - text.rfind("\n", 0, pos)
            reason = f"{reason} at line {self.line} column {self.column}"
        super().__init__(reason)


def loads(raw: bytes | str, parts: PartPaths = ()) -> Any:
    """JSON as the RFC has it (the module's doc): the value, or :class:`JSONRefused`, or
    ``UnicodeDecodeError`` for bytes that are not text. Bytes are read as ``json.loads``
    reads them (UTF-8, 16 or 32, a UTF-8 BOM skipped), and a text starting with a BOM is
    refused as it refuses it. With ``parts``, a body past :data:`MAX_CONTENT_PARTS` is
    refused as :func:`check_parts` refuses it, in a big text as soon as the arrays are
    counted, before their items are read."""
    wanted = _paths(parts)
    try:
        if len(raw) <= PIECE_BYTES:
            value = _FAST.decode(raw)
        else:
            utf8 = raw.encode() if isinstance(raw, str) else raw
            return _pieces(utf8, 0, (), wanted, _Count())
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        # UnicodeError: a str holding a lone surrogate, which UTF-8 cannot encode.
        value = _read_refused(raw)
    _count(value, (), wanted, _Count())
    return value


def _few_objects(raw: bytes | str) -> bool:
    """Whether a text holds so few objects that msgspec reads it whole within a few
    milliseconds, however long its strings or arrays of numbers: objects are what costs (a
    ``{`` in a string counts too: an over-estimate)."""
    if isinstance(raw, str):
        return raw.count("{") <= WHOLE_OBJECTS
    return raw.count(b"{") <= WHOLE_OBJECTS


def _pieces(raw: bytes | msgspec.Raw, depth: int, trail: Trail, paths: Paths, count: _Count) -> Any:
    """A big text read in pieces, none past :data:`PIECE_BYTES` or one level of an array or
    object: each a call of its own into msgspec, which holds the GIL until it returns; between
    them another thread (the event loop's, when a front reads a body in a worker) may run.
    The parts at ``paths`` below it are counted as they come, in the order of the text."""
    if len(memoryview(raw)) > PIECE_BYTES and depth < MAX_PIECE_DEPTH:
        # One copy of a piece's bytes (msgspec.Raw has no count or find), read as bytes.
        data = raw if isinstance(raw, bytes) else memoryview(raw).tobytes()
        raw = data
        first = data[:_LEAD_BYTES].lstrip()[:1] if not _few_objects(data) else b""
        if first == b"{":
            fields = _OBJECT.decode(data)
            BETWEEN_PIECES.get()()
            return {
                key: _pieces(item, depth + 1, (*trail, key), _under(paths, key), count)
                for key, item in fields.items()
            }
        if first == b"[":
            counted = () in paths
            items = _split(data, MAX_CONTENT_PARTS - count.counted if counted else None)
            if counted:
                count.add(len(items), trail)
            return _items(items, depth, trail, _below(paths, _ITEM), count)
    value = _FAST.decode(raw)
    _count(value, trail, paths, count)
    return value


def _split(data: bytes, most: int | None) -> list[msgspec.Raw]:
    """A big array's items as raw texts, read :data:`PIECE_BYTES` at a time: cut at a comma
    past each 64 KiB, the items before it are read as an array of their own. A cut inside a
    string leaves it unterminated, one inside a nested value leaves it unclosed: either fails
    to read, and the next comma is tried (at most :data:`MAX_CUTS_TRIED`, within a piece of
    the first: past them, the rest is read at once, a scan of the few big items it holds); one
    that reads was between two items. Stops once past ``most`` items, the
    bound the caller then refuses them by (130,000 parts are not all read to be refused)."""
    opening, closing = data.find(b"["), data.rfind(b"]")
    if data[:opening].strip() or data[closing + 1 :].strip():
        raise msgspec.DecodeError("not one array")
    items: list[msgspec.Raw] = []
    start = opening + 1
    while most is None or len(items) <= most:
        batch = None
        cut = first = data.find(b",", start + PIECE_BYTES, closing)
        # Past a piece from the first comma tried, the item the cuts fall in is a big one.
        for _ in range(MAX_CUTS_TRIED):
            if not 0 <= cut < first + PIECE_BYTES:
                break
            try:
                batch = _ARRAY.decode(b"[" + data[start:cut] + b"]")
            except msgspec.DecodeError:
                cut = data.find(b",", cut + 1, closing)
                continue
            if not batch:  # nothing before the comma: "[," or ",,"
                raise msgspec.DecodeError("an empty item")
            break
        if batch is None:
            last = _ARRAY.decode(b"[" + data[start:closing] + b"]")
            if not last and (items or data[start:closing].strip()):
                raise msgspec.DecodeError("a trailing comma")
            items.extend(last)
            return items
        items.extend(batch)
        BETWEEN_PIECES.get()()
        start = cut + 1
    return items


def _items(
    items: list[msgspec.Raw], depth: int, trail: Trail, paths: Paths, count: _Count
) -> list[Any]:
    """An array's items: a big one in pieces, consecutive small ones read together, up to
    :data:`PIECE_BYTES` at a time (one call per item would cost a token list of 100,000 ids
    a third of a second)."""
    out: list[Any] = []
    group: list[msgspec.Raw] = []
    size = 0

    def read_group() -> None:
        start = len(out)
        out.extend(_FAST.decode(b"[" + b",".join(group) + b"]"))
        for i in range(start, len(out)):
            _count(out[i], (*trail, i), paths, count)
        group.clear()

    for item in items:
        length = len(memoryview(item))
        if length > PIECE_BYTES:
            if group:
                read_group()
            out.append(_pieces(item, depth + 1, (*trail, len(out)), paths, count))
            continue
        if size + length > PIECE_BYTES and group:
            read_group()
            size = 0
        group.append(item)
        size += length + 1
    if group:
        read_group()
    return out


def _read_refused(raw: bytes | str) -> Any:
    """What msgspec refused: its refusal placed, or its value where ``json`` reads it and the
    scan finds nothing wrong (UTF-16, a UTF-8 BOM)."""
    if isinstance(raw, str):
        if raw.startswith("\ufeff"):
            raise JSONRefused("Unexpected UTF-8 BOM (decode using utf-8-sig)", raw, 0)
        text = raw
    else:
        text = raw.decode(json.detect_encoding(raw))
    try:
        value = _LENIENT.decode(text)
    except json.JSONDecodeError as exc:
        raise JSONRefused(exc.msg, text, exc.pos) from None
    except (RecursionError, ValueError):
        # Nested past the parser, or an integer past int's digits: the scan finds where.
        value = _UNREAD
    # Nesting within the parser is refused later, by validation, naming the path; past it, the
    # scan places it (past MAX_DEPTH: the parser's own depth depends on the caller's stack).
    _scan(text, MAX_DEPTH if value is _UNREAD else None)
    if value is _UNREAD:
        raise JSONRefused("nested too deeply")
    return value


def _scan(text: str, max_depth: int | None) -> None:
    """Raise at the first token of a JSON text ``json`` read (or read until its nesting or an
    integer stopped it) that is not JSON as RFC 8259 has it, or that nests past ``max_depth``."""
    depth = 0
    digits = sys.get_int_max_str_digits()
    for match in _TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        if first == '"':
            if "\\u" in token or _SURROGATE_CHAR.search(token):
                _surrogates(text, match.start(), token)
        elif first in "[{":
            depth += 1
            if max_depth is not None and depth > max_depth:
                raise JSONRefused(
                    f"nested too deeply (more than {max_depth} levels of objects and arrays)",
                    text,
                    match.start(),
                )
        elif first in "]}":
            depth -= 1
        elif token == "NaN" or token.endswith("Infinity"):
            raise JSONRefused(f"{token} is not a JSON value", text, match.start())
        elif not any(c in token for c in ".eE"):
            if digits and len(token.lstrip("-")) > digits:
                raise JSONRefused(
                    f"an integer of {len(token.lstrip('-'))} digits (at most {digits})",
                    text,
                    match.start(),
                )
        elif math.isinf(float(token)):
            raise JSONRefused(
                "a number out of range (past a double's 1.8e308)", text, match.start()
            )


def _surrogates(text: str, start: int, token: str) -> None:
    """Raise at a lone surrogate in a string token (at ``start`` in ``text``): an escape of
    one half of a UTF-16 pair that the other half does not follow or precede, or the
    character itself (a ``str`` body can hold one)."""
    raw = _SURROGATE_CHAR.search(token)
    if raw is not None:
        raise JSONRefused(_lone(ord(raw.group())), text, start + raw.start())
    high_at = high_end = -1
    for escape in _ESCAPE.finditer(token):
        hex_digits = escape.group(1)
        code = int(hex_digits, 16) if hex_digits is not None else -1
        if high_at >= 0:
            if code in _LOW and escape.start() == high_end:
                high_at = -1
                continue
            raise JSONRefused(
                _lone(int(token[high_at + 2 : high_at + 6], 16)), text, start + high_at
            )
        if code in _HIGH:
            high_at, high_end = escape.start(), escape.end()
        elif code in _LOW:
            raise JSONRefused(_lone(code), text, start + escape.start())
    if high_at >= 0:
        raise JSONRefused(_lone(int(token[high_at + 2 : high_at + 6], 16)), text, start + high_at)


def _lone(code: int) -> str:
    return f"a lone surrogate \\u{code:04x} (half of a UTF-16 pair, not a character)"


def check_parts(body: object, paths: PartPaths) -> None:
    """Refuse a body with more than :data:`MAX_CONTENT_PARTS` items in the arrays at
    ``paths``, naming the first item past the bound, the arrays counted in the order of the
    text (an array before what it holds)."""
    _count(body, (), _paths(paths), _Count())


# A path's step that stands for every item of an array; a tuple of paths still to follow.
_ITEM: Final = "*"
Paths: TypeAlias = tuple[tuple[str, ...], ...]
Trail: TypeAlias = tuple[str | int, ...]


def _paths(parts: PartPaths) -> Paths:
    return tuple(tuple(path) for path in parts)


def _below(paths: Paths, step: str) -> Paths:
    """The paths to follow under a key (or, with :data:`_ITEM`, an item) of the node they
    were followed to."""
    if not paths:
        return paths
    return tuple(path[1:] for path in paths if path and path[0] == step)


def _under(paths: Paths, key: str) -> Paths:
    """:func:`_below` a key of an object: a key "*" is no item of an array."""
    return () if key == _ITEM else _below(paths, key)


class _Count:
    """The parts counted so far in one body."""

    def __init__(self) -> None:
        self.counted = 0

    def add(self, items: int, trail: Trail) -> None:
        if self.counted + items > MAX_CONTENT_PARTS:
            where = _render((*trail, MAX_CONTENT_PARTS - self.counted))
            raise invalid(
                where,
                f"too many content parts. Expected at most {MAX_CONTENT_PARTS} messages "
                "and content parts in the request body (MAX_CONTENT_PARTS), but got more.",
            )
        self.counted += items


def _count(value: object, trail: Trail, paths: Paths, count: _Count) -> None:
    if not paths:
        return
    if isinstance(value, list):
        if () in paths:
            count.add(len(value), trail)
        below = _below(paths, _ITEM)
        if below:
            for i, item in enumerate(value):
                _count(item, (*trail, i), below, count)
    elif isinstance(value, dict):
        for key, item in value.items():
            _count(item, (*trail, key), _under(paths, key), count)


def _render(trail: Trail) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in trail)[1:]
