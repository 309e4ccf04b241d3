"""Where a chunked body ends (``http1/chunks.py``, the framer on its own): chunk sizes,
extensions and trailers, their bounds exactly at their limit, however the bytes are cut, and
nothing but ``H1Error`` raised, whatever the bytes. Its messages are matched word for word."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.h1_helpers import chunked, split_at
from trio_gateway.http1.chunks import MAX_SIZE_HEX_DIGITS, ChunkFramer
from trio_gateway.http1.errors import H1Error

CRLF = b"\r\n"


def framer(max_line_bytes: int = 1024, max_trailer_bytes: int = 1024) -> ChunkFramer:
    return ChunkFramer(max_line_bytes=max_line_bytes, max_trailer_bytes=max_trailer_bytes)


def framed(f: ChunkFramer, reads: list[bytes]) -> int:
    """How many of the bytes of ``reads`` the framer takes, until it is done."""
    total = 0
    for data in reads:
        used = f.scan(data)
        assert 0 <= used <= len(data)
        assert used == len(data) or f.done
        total += used
        if f.done:
            break
    return total


@settings(max_examples=300)
@given(
    st.lists(st.binary(max_size=300), max_size=12),
    st.lists(st.integers(min_value=0), max_size=20),
    st.sampled_from([b"", b";ext=1", b'; name="v"', b";" + b"e" * 100]),
    st.sampled_from([b"", b"x-checksum: abc\r\n"]),
    st.binary(max_size=20),
)
def test_the_framer_finds_a_body_whole_however_it_is_cut(
    parts: list[bytes], cuts: list[int], extension: bytes, trailer: bytes, after: bytes
) -> None:
    wire = chunked(parts, extension, trailer)
    f = framer()
    assert framed(f, split_at(wire + after, cuts)) == len(wire)
    assert f.done


def test_the_framer_finds_a_body_fed_byte_by_byte() -> None:
    wire = chunked([b"hello", b"\r\n0\r\n\r\n", b"x" * 17], b";a=b", b"T: 1\r\n")
    f = framer()
    used = [f.scan(wire[i : i + 1]) for i in range(len(wire))]
    assert used == [1] * len(wire) and f.done
    assert f.scan(b"GET") == 0 and f.scan(b"") == 0


def test_the_framer_stops_at_the_end_of_the_body() -> None:
    f = framer()
    wire = b"5\r\nhello\r\n0\r\n\r\n"
    assert f.scan(wire + b"0\r\n\r\n") == len(wire) and f.done
    assert f.scan(b"more") == 0


def test_sixteen_hex_digits_are_a_size_seventeen_are_not_even_as_zeros() -> None:
    assert MAX_SIZE_HEX_DIGITS == 16
    f = framer()
    assert f.scan(b"ffffffffffffffff\r\nabc") == 21 and not f.done
    assert framed(framer(), [b"0" * 15 + b"5\r\nhello\r\n0\r\n\r\n"]) == 30
    for size in (b"0" * 16 + b"5", b"1" * 17):
        with pytest.raises(H1Error) as caught:
            framer().scan(size + b"\r\n")
        assert (caught.value.status, caught.value.message) == (
            400,
            f"not a chunk size: {size + CRLF!r}",
        )


@pytest.mark.parametrize("size", [b"+5", b"-5", b"0x5", b"0X5", b"", b" 5", b"5 ", b"5\t", b"g"])
def test_chunk_sizes_are_bare_hex(size: bytes) -> None:
    with pytest.raises(H1Error) as caught:
        framer().scan(size + b"\r\nhello\r\n")
    assert caught.value.message == f"not a chunk size: {size + CRLF!r}"


def test_hex_digits_of_either_case() -> None:
    wire = b"A\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n"
    assert framed(framer(), [wire]) == len(wire)


def test_extensions_after_the_first_semicolon_are_ignored() -> None:
    wire = b"5;a=1;b=2\r\nhello\r\n0;last\r\n\r\n"
    f = framer()
    assert f.scan(wire) == len(wire) and f.done
    with pytest.raises(H1Error, match="not a chunk size"):
        framer().scan(b"5x;a=1\r\n")


def test_a_long_bad_size_line_is_quoted_short() -> None:
    with pytest.raises(H1Error) as caught:
        framer().scan(b"z" * 500 + b"\r\n")
    assert caught.value.message.startswith("not a chunk size: b'zzzz")
    assert len(caught.value.message) < 80


@pytest.mark.parametrize("pieces", [1, 2, 0])
def test_the_size_line_bound_is_exact(pieces: int) -> None:
    """A size line, its extensions and its CRLF, of ``max_line_bytes`` at most: at once, in two
    reads, or a byte at a time (0)."""
    line = b"5;" + b"e" * 28 + b"\r\n"
    assert len(line) == 32

    def reads(data: bytes) -> list[bytes]:
        if pieces == 0:
            return [data[i : i + 1] for i in range(len(data))]
        return split_at(data, [len(data) // 2] if pieces == 2 else [])

    wire = line + b"hello\r\n0\r\n\r\n"
    assert framed(framer(max_line_bytes=32), reads(wire)) == len(wire)
    with pytest.raises(H1Error) as caught:
        framed(framer(max_line_bytes=31), reads(wire))
    assert (caught.value.status, caught.value.message) == (
        400,
        "a chunk-size line longer than 31 bytes",
    )
    # An endless line is refused without its end.
    with pytest.raises(H1Error, match="a chunk-size line longer than 31 bytes"):
        framed(framer(max_line_bytes=31), reads(b"5;" + b"e" * 30))


def test_the_last_size_line_is_bounded_too() -> None:
    line = b"0;" + b"e" * 28 + b"\r\n"
    assert framed(framer(max_line_bytes=32), [line + b"\r\n"]) == 34
    with pytest.raises(H1Error, match="a chunk-size line longer than 31 bytes"):
        framer(max_line_bytes=31).scan(line + b"\r\n")


def test_the_trailer_bound_is_exact() -> None:
    """The trailer section is its field lines and the blank line that ends it."""
    trailers = b"X-Checksum: abc\r\nX-More: 1\r\n\r\n"
    assert len(trailers) == 30
    wire = b"5\r\nhello\r\n0\r\n" + trailers
    f = framer(max_trailer_bytes=30)
    assert f.scan(wire) == len(wire) and f.done
    byte_by_byte = framer(max_trailer_bytes=30)
    assert framed(byte_by_byte, [wire[i : i + 1] for i in range(len(wire))]) == len(wire)
    with pytest.raises(H1Error) as caught:
        framer(max_trailer_bytes=29).scan(wire)
    assert (caught.value.status, caught.value.message) == (431, "trailers larger than 29 bytes")
    with pytest.raises(H1Error, match="trailers larger than 29 bytes"):
        framed(framer(max_trailer_bytes=29), [b"0\r\n", b"X-Endless: " + b"a" * 40])


def test_trailers_end_at_the_blank_line() -> None:
    f = framer()
    assert f.scan(b"0\r\nX-A: 1\r\n") == 11 and not f.done
    assert f.scan(b"X-B: \r\n") == 7 and not f.done  # an empty value is not a blank line
    assert f.scan(b"\r") == 1 and not f.done
    assert f.scan(b"\nNEXT") == 1 and f.done


@settings(max_examples=500)
@given(
    st.lists(st.binary(max_size=60), max_size=8),
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=1, max_value=64),
)
def test_the_framer_takes_any_bytes_with_the_one_error(
    reads: list[bytes], max_line_bytes: int, max_trailer_bytes: int
) -> None:
    f = framer(max_line_bytes, max_trailer_bytes)
    try:
        for data in reads:
            used = f.scan(data)
            assert 0 <= used <= len(data)
            assert used == len(data) or f.done
    except H1Error as exc:
        assert exc.status in (400, 431)
        assert exc.message
