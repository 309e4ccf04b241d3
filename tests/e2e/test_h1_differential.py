"""The gateway's HTTP/1.x front against h11, on real sockets (issue 26, item 3).

Each vector of ``tests/h1_vectors/`` is written to a fresh connection of the real server,
followed by a sentinel request (``GET /__end`` with ``Connection: close``) so that every
conversation has a definite end. The server's app echoes each request (method, target, version,
the body's length and sha256). What the server should do is what h11 does with the same bytes
(``tests/h1_reference.py``):

- where h11 frames the requests, the server answers the same ones, in order, with the same
  method, target and body, and closes after the one that asked (the sentinel, or earlier);
- where h11 refuses the k-th request, the server answers the ones before it as h11 framed them,
  then one error (400, 413, 431, 501 or 505) that says ``connection: close``, and closes;

except for the deliberate differences (``DIFFERENCES``, in ``h1_differences.py``): requests the
gateway refuses although h11 accepts them, each with its reason. A difference is always the
gateway being stricter; where the server is more lenient than h11, the test fails.

Run directly for a table of every vector, h11's verdict, the server's and whether they agree::

    .venv/bin/python -m tests.e2e.test_h1_differential [NAME-SUBSTRING ...]
"""

from __future__ import annotations

import sys

import pytest
import trio

from tests.e2e.h1_conversation import converse, parse_responses, serving_strict
from tests.e2e.h1_differences import DIFFERENCES
from tests.e2e.h1_expectation import expect, judge, reference
from tests.h1_vectors import VECTORS, Vector

# --- the test ------------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS, ids=[v.name for v in VECTORS])
async def test_the_front_frames_requests_as_h11_does(vector: Vector) -> None:
    expectation = expect(reference(vector))
    async with serving_strict() as port:
        conversation = await converse(port, vector)
    problems = judge(expectation, conversation)
    assert not problems, (
        f"{vector.name}: expected {expectation.describe()} ({expectation.because}); "
        f"the server gave {conversation.describe()}: " + "; ".join(problems)
    )


def test_every_difference_is_met_by_a_vector_h11_accepts() -> None:
    """No dead row in the table: each difference decides at least one vector's expectation."""
    met: set[str] = set()
    for vector in VECTORS:
        because = expect(reference(vector)).because
        if because.startswith("differs: "):
            met.update(because.removeprefix("differs: ").split(", "))
    assert met == {d.name for d in DIFFERENCES}


def test_responses_are_read_strictly() -> None:
    data = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"
        b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\ncontent-length: 1\r\n\r\nx"
        b"junk"
    )
    responses, garbage = parse_responses(data)
    assert [(r.status, r.body, r.closes) for r in responses] == [
        (100, b"", False),
        (200, b"ok", False),
        (200, b"abc", False),
        (400, b"x", True),
    ]
    assert garbage == b"junk"


# --- the summary, run directly ---------------------------------------------------------------


async def summary(only: list[str]) -> int:
    """Every vector (or those whose name holds one of ``only``): h11's verdict, what the test
    expects, the server's answers, and whether they agree. The number that disagree."""
    wrong = 0
    vectors = [v for v in VECTORS if not only or any(part in v.name for part in only)]
    for vector in vectors:
        ref = reference(vector)
        expectation = expect(ref)
        async with serving_strict() as port:
            conversation = await converse(port, vector)
        problems = judge(expectation, conversation)
        wrong += bool(problems)
        print(
            f"{'ok  ' if not problems else 'FAIL'} {vector.name:44} {vector.family:17} "
            f"h11: {ref.describe()[:60]:60} | expect: {expectation.describe():24} | "
            f"server: {conversation.describe()}"
        )
        for problem in problems:
            print(f"       {problem}")
    print(f"{wrong} of {len(vectors)} vectors disagree")
    return wrong


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.CRITICAL)  # today's server logs the tracebacks it meets
    sys.exit(1 if trio.run(summary, sys.argv[1:]) else 0)
