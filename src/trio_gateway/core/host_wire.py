"""The wire between a supervisor's host broker and its workers (``[server] workers``), pure.

One Unix stream socket per worker (a socketpair the supervisor makes before it starts the
worker). Each message is a *frame*: a 4-byte big-endian length, then a msgpack array
``[call, method, body]``, where ``body`` is the method's own msgpack value (each layer encodes
its own: the gates in ``capacity/host_slots.py``, budgets and rate limits in
``accounting/host_store.py``). ``call`` is the asker's number for a request that wants an
answer (a ``REPLY`` frame with the same number), 0 for one that wants none.

Frames are bounded (``MAX_FRAME_BYTES``): a longer one is a broken peer, and its connection
is closed.
"""

from __future__ import annotations

import struct

import msgspec

# The methods. A reply names no method of its own: it answers the call of its number.
REPLY = 0
GATE_ACQUIRE = 1  # answered: granted now, refused, or (waiting) granted later
GATE_RELEASE = 2  # not answered: the slot, or the wait, of an earlier GATE_ACQUIRE
LIMITS_ADMIT = 3  # answered: the store's admission
LIMITS_SETTLE = 4  # not answered
GATE_RESIZE = 5  # not answered: a reload's new sizes (waiters a larger gate lets in are)
LIMITS_SPENT = 6  # answered: what a key spent in a period (the status page, keys list)
METHODS = frozenset(
    {GATE_ACQUIRE, GATE_RELEASE, LIMITS_ADMIT, LIMITS_SETTLE, GATE_RESIZE, LIMITS_SPENT}
)

# A budget admission's arguments are the largest body (an API key's name, a hold id): a few
# hundred bytes. Anything near this bound is not a message of ours.
MAX_FRAME_BYTES = 64 * 1024
_LENGTH = struct.Struct(">I")


class FrameError(ValueError):
    """Bytes that are not a frame of this wire (too long, or not msgpack of its shape)."""


class Frame(msgspec.Struct, array_like=True, frozen=True):
    call: int
    method: int
    body: msgspec.Raw


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Frame)


def encode_frame(call: int, method: int, body: bytes) -> bytes:
    payload = _ENCODER.encode(Frame(call, method, msgspec.Raw(body)))
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {len(payload)} bytes (at most {MAX_FRAME_BYTES})")
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Frames out of a byte stream cut anywhere: at most one partial frame is kept."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._rest = b""

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes; raises ``FrameError`` on bytes that cannot be one."""
        buf = self._rest + data if self._rest else data
        frames: list[Frame] = []
        pos, end = 0, len(buf)
        while end - pos >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(buf, pos)
            if size > self.max_frame_bytes:
                raise FrameError(f"a frame of {size} bytes (at most {self.max_frame_bytes})")
            stop = pos + _LENGTH.size + size
            if stop > end:
                break
            try:
                frames.append(_DECODER.decode(buf[pos + _LENGTH.size : stop]))
            except msgspec.DecodeError as exc:
                raise FrameError(f"not a frame: {exc}") from None
            pos = stop
        self._rest = buf[pos:]
        return frames

    @property
    def pending_bytes(self) -> int:
        return len(self._rest)
