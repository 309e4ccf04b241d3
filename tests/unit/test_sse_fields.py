"""The SSE decoder's field handling: names and ids that are not UTF-8, ids with NUL, unknown
fields, and a decoder reused after ``close``."""

from __future__ import annotations

import pytest

from trio_gateway.core.sse import SSEDecodeError, SSEDecoder, SSEEvent


def test_event_names_and_ids_that_are_not_utf8_are_replaced_not_raised() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"event: \xffdelta\nid: 7\xfe\ndata: x\n\n")
    assert events == [SSEEvent(data=b"x", event="\ufffddelta", id="7\ufffd")]


def test_an_id_with_nul_is_ignored_and_the_last_id_stays() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 1\ndata: a\n\n") == [SSEEvent(data=b"a", id="1")]
    assert decoder.feed(b"id: 2\x003\ndata: b\n\n") == [SSEEvent(data=b"b", id="1")]


def test_unknown_fields_change_nothing() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 1\nretry: 1000\nfoo: bar\ndata: a\n\n") == [
        SSEEvent(data=b"a", id="1")
    ]


def test_comments_are_skipped() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b": keep-alive\n:\ndata: a\n\n") == [SSEEvent(data=b"a")]


def test_after_close_the_decoder_starts_a_new_stream() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: b") == [SSEEvent(data=b"a")]
    assert decoder.close() == [SSEEvent(data=b"b")]
    assert decoder.close() == []
    assert decoder.feed(b"data: c\n\n") == [SSEEvent(data=b"c")]


def test_a_crlf_split_between_two_reads_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\ndata: b\r") == []
    assert decoder.feed(b"\n\r\n") == [SSEEvent(data=b"a\nb")]


def test_crlf_inside_one_read_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r\ndata: b\r\n\r\n") == [SSEEvent(data=b"a\nb")]


def test_a_lone_cr_ends_a_line_and_an_lf_after_a_later_cr_is_not_skipped() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r\rdata: b\n") == [SSEEvent(data=b"a")]
    assert decoder.feed(b"\n") == [SSEEvent(data=b"b")]


def test_a_pending_line_may_take_exactly_max_line_bytes() -> None:
    decoder = SSEDecoder(max_line_bytes=8)
    assert decoder.feed(b"data: ab") == []  # 8 bytes, no line end yet
    with pytest.raises(SSEDecodeError, match="exceeded 8 bytes"):
        decoder.feed(b"c")
