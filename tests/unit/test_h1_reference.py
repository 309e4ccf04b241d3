"""The differential test's reference (h11 driven as a server, ``tests/h1_reference.py``) and its
corpus (``tests/h1_vectors/``): that the model frames what h11 frames, bounds heads as a
server reading byte by byte would, and keeps the raw bytes the test's differences look at."""

from __future__ import annotations

from typing import get_args

import pytest

from tests.h1_reference import Reference, frame_with_h11
from tests.h1_vectors import HEAD_BOUND, VECTORS, Family, Vector, get, post

BOUND = 100  # a small head bound, for the tests of the bound itself


def frame(data: bytes, max_head_bytes: int = HEAD_BOUND) -> Reference:
    return frame_with_h11(data, max_head_bytes=max_head_bytes)


def test_pipelined_requests_are_framed_in_order_with_their_bodies_and_raw_bytes() -> None:
    chunked = (
        b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;e=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"
    )
    data = get("/1") + post(b"abc", "/2") + chunked + get("/4", "Connection: close") + get("/5")
    ref = frame(data)
    assert ref.verdict == "closed"
    assert [(r.method, r.target, r.body) for r in ref.requests] == [
        (b"GET", b"/1", b""),
        (b"POST", b"/2", b"abc"),
        (b"POST", b"/c", b"hello"),
        (b"GET", b"/4", b""),
    ]
    assert ref.requests[2].trailers == ((b"x-t", b"1"),)
    assert ref.requests[2].raw_body == b"5;e=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"
    # The raw bytes of the requests are the conversation's bytes, up to the close.
    raw = b"".join(r.raw_head + r.raw_body for r in ref.requests)
    assert data.startswith(raw) and data[len(raw) :] == get("/5")


def test_a_refusal_names_the_request_and_keeps_the_one_refused_in_its_body() -> None:
    bad = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n"
    ref = frame(get("/1") + bad + get("/3"))
    assert ref.verdict == "refused" and ref.refused_at == 1 and ref.status_hint == 400
    assert len(ref.complete) == 1
    assert ref.requests[1].target == b"/c" and not ref.requests[1].complete
    head_refused = frame(get("/1") + b"GET / HTTP/1.1\r\n\r\n")  # no Host
    assert head_refused.refused_at == 1 and len(head_refused.requests) == 1


def test_http10_keep_alive_goes_on_and_anything_else_closes() -> None:
    ten = b"GET /ten HTTP/1.0\r\n%b\r\n"
    keep = frame(ten % b"Connection: keep-alive\r\n" + get("/2"))
    assert [r.target for r in keep.requests] == [b"/ten", b"/2"] and keep.verdict == "incomplete"
    for connection in (b"", b"Connection: keep-alive, close\r\n", b"Connection: other\r\n"):
        ref = frame(ten % connection + get("/2"))
        assert [r.target for r in ref.requests] == [b"/ten"] and ref.verdict == "closed"


def test_a_body_still_to_come_is_incomplete() -> None:
    ref = frame(post(b"abc")[:-1])
    assert ref.verdict == "incomplete" and not ref.requests[0].complete
    assert ref.requests[0].body == b"ab"


@pytest.mark.parametrize(("size", "refused"), [(BOUND + 1, False), (BOUND + 2, True)])
def test_the_head_bound_is_a_streaming_servers(size: int, refused: bool) -> None:
    """h11 refuses once more than the bound is buffered without the head's end: a head of
    bound + 1 bytes passes (its last byte ends it), one more byte does not. Given in one piece,
    h11 alone would take a head of any size."""
    base = get("/", "X: ")
    head = base[:-4] + b"a" * (size - len(base)) + b"\r\n\r\n"
    assert len(head) == size
    ref = frame(head + get("/next"), max_head_bytes=BOUND)
    assert (ref.verdict == "refused", ref.status_hint) == (refused, 431 if refused else None)


def test_trailers_are_bounded_like_a_head() -> None:
    te = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
    small = frame(te + b"X: " + b"a" * 50 + b"\r\n\r\n", max_head_bytes=BOUND)
    large = frame(te + b"X: " + b"a" * 150 + b"\r\n\r\n", max_head_bytes=BOUND)
    assert small.verdict == "incomplete" and small.requests[0].complete
    assert (large.verdict, large.status_hint) == ("refused", 431)


@pytest.mark.parametrize(
    "vector", [v for v in VECTORS if len(v.data) < 80_000], ids=lambda v: str(v.name)
)
def test_the_pieces_h11_is_fed_do_not_change_its_verdict(vector: Vector) -> None:
    data = vector.data + get("/__end", "Connection: close")
    whole = frame(data)
    byte_by_byte = frame_with_h11(data, max_head_bytes=HEAD_BOUND, piece_bytes=1)
    assert outcome(byte_by_byte) == outcome(whole)


def outcome(ref: Reference) -> tuple[object, ...]:
    """All but what depends on how much was fed: the raw bytes of a request h11 did not finish
    (what it was given of it) and the wording of its error."""
    unfinished = [(r.method, r.target, r.headers) for r in ref.requests if not r.complete]
    return (ref.verdict, ref.refused_at, ref.status_hint, ref.complete, unfinished)


def test_the_corpus() -> None:
    names = [v.name for v in VECTORS]
    assert len(names) >= 120 and len(set(names)) == len(names)
    assert {v.family for v in VECTORS} == set(get_args(Family))
    for vector in VECTORS:  # no upgrade, no CONNECT: frame_with_h11 raises on them
        frame(vector.data)
