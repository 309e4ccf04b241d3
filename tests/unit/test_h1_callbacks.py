"""llhttp's callbacks shared by every parser (http1/callbacks.py): a parser holds no bound
method of its own state, so nothing of a stream waits for the cyclic collector."""

from __future__ import annotations

import gc
import weakref

from trio_gateway.http1.request import RequestParser
from trio_gateway.http1.response import ResponseParser

ANSWER = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
REQUEST = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"


def test_a_response_parser_is_freed_by_its_last_reference_not_by_the_collector() -> None:
    gc.disable()
    try:
        parser = ResponseParser()
        assert parser.feed(ANSWER) is not None and parser.pieces() == [b"ok"] and parser.done
        gone = weakref.ref(parser)
        del parser
        assert gone() is None
    finally:
        gc.enable()


def test_a_request_parser_is_freed_by_its_last_reference_and_drops_llhttp_s_between_requests() -> (
    None
):
    gc.disable()
    try:
        parser = RequestParser(max_body_bytes=10)
        parser.head(REQUEST)
        assert parser._parser is not None  # the body is still to come
        assert parser.body(b"ok") == ([b"ok"], 2) and parser.body_done
        assert parser._parser is None  # not held through the answer
        parser.head(REQUEST.replace(b"POST", b"GET").replace(b"Content-Length: 2\r\n", b""))
        assert parser._parser is None  # a request without a body is whole at its head
        gone = weakref.ref(parser)
        del parser
        assert gone() is None
    finally:
        gc.enable()


def test_two_parsers_fed_in_turn_keep_their_own_state() -> None:
    first, second = ResponseParser(), ResponseParser()
    first.feed(ANSWER[:30])
    second.feed(ANSWER)
    first.feed(ANSWER[30:])
    assert first.pieces() == second.pieces() == [b"ok"]
    assert first.done and second.done
