"""The host broker's gates (capacity/host_slots.py) and its wire (core/host_wire.py), pure: the
asks of several workers in one queue, a release that crosses a grant, a worker dropped, a
resize from the latest ask, and frames read back from a stream cut anywhere."""

from __future__ import annotations

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings

from trio_gateway.capacity.host_slots import (
    AcquireBody,
    AcquireReply,
    Answer,
    HostSlots,
    ResizeBody,
)
from trio_gateway.core.host_wire import (
    GATE_ACQUIRE,
    MAX_FRAME_BYTES,
    Frame,
    FrameError,
    FrameReader,
    encode_frame,
)


def ask(
    gate: str = "vllm",
    *,
    total: int = 2,
    priority: int = 0,
    rank_in_s: float = 0.0,
    wait: bool = True,
    reserved: tuple[int, int] = (0, 0),
) -> AcquireBody:
    return AcquireBody(gate, total, reserved[0], reserved[1], priority, rank_in_s, wait)


def granted(worker: int, call: int, in_flight: int, waiting: int = 0) -> Answer:
    return Answer(worker, call, AcquireReply(True, in_flight, waiting))


def test_workers_share_one_queue_served_by_rank() -> None:
    slots = HostSlots()
    assert slots.acquire(1, 10, ask(), 0.0) == [granted(1, 10, 1)]
    assert slots.acquire(2, 10, ask(), 0.0) == [granted(2, 10, 2)]
    # Full: a nowait ask is refused, waiting asks queue by rank (worker 1's came first but
    # ranks later: a lower priority's aging).
    assert slots.acquire(2, 11, ask(wait=False), 1.0) == [Answer(2, 11, AcquireReply(False, 2, 0))]
    assert slots.acquire(1, 11, ask(priority=5), 11.0) == []
    assert slots.acquire(2, 12, ask(), 2.0) == []
    assert slots.statistics("vllm") is not None
    assert slots.release(1, 10) == [granted(2, 12, 2, 1)]
    assert slots.release(2, 10) == [granted(1, 11, 2, 0)]
    assert slots.requests_of(1) == 1 and slots.requests_of(2) == 1


def test_a_release_crossing_a_grant_frees_the_slot_and_unknown_calls_are_nothing() -> None:
    slots = HostSlots()
    slots.acquire(1, 1, ask(total=1), 0.0)
    assert slots.acquire(2, 1, ask(total=1), 1.0) == []
    assert slots.acquire(3, 1, ask(total=1), 2.0) == []
    # Worker 2 gave up (its release is on the wire) as worker 1's slot went to it: the
    # release frees that slot for worker 3.
    assert slots.release(1, 1) == [granted(2, 1, 1, 1)]
    assert slots.release(2, 1) == [granted(3, 1, 1)]
    assert slots.release(2, 1) == []
    assert slots.release(9, 9) == []


def test_a_worker_dropped_gives_back_its_slots_and_waits_at_once() -> None:
    slots = HostSlots()
    for call in (1, 2):
        slots.acquire(1, call, ask(), 0.0)
    slots.acquire(1, 3, ask(), 0.0)  # waiting
    assert slots.acquire(2, 1, ask(), 1.0) == []
    answers = slots.drop(1)
    assert answers == [granted(2, 1, 2)]  # counted as granted, before the second release
    assert slots.requests_of(1) == 0
    stats = slots.statistics("vllm")
    assert stats is not None and (stats.borrowed_tokens, stats.tasks_waiting) == (1, 0)
    slots.release(2, 1)
    assert slots.statistics("vllm") is None  # an idle gate leaves nothing behind


def test_the_latest_ask_resizes_the_gate_and_a_reservation_holds_across_workers() -> None:
    slots = HostSlots()
    # max_inflight 3, one slot reserved for priority <= 0: the capped class holds 2 at most.
    low = ask(priority=4, total=3, reserved=(1, 0))
    high = ask(priority=0, total=3, reserved=(1, 0))
    assert slots.acquire(1, 1, low, 0.0) == [granted(1, 1, 1)]
    assert slots.acquire(2, 1, low, 0.0) == [granted(2, 1, 2)]
    assert slots.acquire(1, 2, low, 0.0) == []
    assert slots.acquire(2, 2, high, 1.0) == [granted(2, 2, 3, 1)]
    # A reload to 4 slots: the first ask that carries it lets the capped waiter in, then waits.
    assert slots.acquire(2, 3, ask(priority=0, total=4, reserved=(1, 0)), 2.0) == [granted(1, 2, 4)]
    assert slots.requests_of(2) == 3


def test_a_worker_past_its_bound_or_reusing_a_call_is_refused() -> None:
    slots = HostSlots(max_requests_per_worker=2)
    slots.acquire(1, 1, ask(total=5), 0.0)
    assert slots.acquire(1, 1, ask(total=5), 0.0) == [Answer(1, 1, AcquireReply(False, 1, 0))]
    slots.acquire(1, 2, ask(total=5), 0.0)
    assert slots.acquire(1, 3, ask(total=5), 0.0) == [Answer(1, 3, AcquireReply(False, 2, 0))]


FRAMES = st.lists(
    st.tuples(st.integers(0, 2**40), st.integers(0, 4), st.binary(max_size=200)), max_size=8
)


@settings(max_examples=100, deadline=None)
@given(frames=FRAMES, cuts=st.lists(st.integers(0, 4000), max_size=10))
def test_frames_come_back_whole_from_a_stream_cut_anywhere(
    frames: list[tuple[int, int, bytes]], cuts: list[int]
) -> None:
    # A body is the method's own msgpack value: bytes, encoded, stand in for any.
    sent = [(call, method, msgspec.msgpack.encode(body)) for call, method, body in frames]
    stream = b"".join(encode_frame(*frame) for frame in sent)
    reader = FrameReader()
    got: list[Frame] = []
    start = 0
    for cut in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
        got += reader.feed(stream[start:cut])
        start = cut
    assert [(f.call, f.method, bytes(f.body)) for f in got] == sent
    assert reader.pending_bytes == 0


def test_a_frame_too_long_or_not_msgpack_is_refused() -> None:
    with pytest.raises(FrameError):
        encode_frame(1, GATE_ACQUIRE, msgspec.msgpack.encode(b"x" * MAX_FRAME_BYTES))
    with pytest.raises(FrameError, match="at most"):
        FrameReader().feed((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(FrameError, match="not a frame"):
        FrameReader().feed(b"\x00\x00\x00\x02\xc1\xc1")


def test_a_resize_applies_at_once_and_a_gate_nobody_uses_has_nothing_to_resize() -> None:
    slots = HostSlots()
    assert slots.resize(ResizeBody("vllm", 5, 0, 0)) == []
    slots.acquire(1, 1, ask(total=1), 0.0)
    slots.acquire(2, 1, ask(total=1), 1.0)
    assert slots.resize(ResizeBody("vllm", 1, 0, 0)) == []  # the same size
    assert slots.resize(ResizeBody("vllm", 2, 0, 0)) == [granted(2, 1, 2)]
