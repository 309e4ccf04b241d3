"""Raw HTTP/1.x request vectors for the differential test of the gateway's front against h11
(issue 26, item 3: ``tests/e2e/test_h1_differential.py``).

A vector is bytes and nothing else: a name, a family, and what the client writes (in several
writes where the framing should be read across reads). What the server ought to do with them
is never written here: it is what h11 does (``tests/h1_reference.py``), except for the
deliberate differences the test lists with their reasons. Every conversation ends with the
test's own sentinel request, appended to the last write.

No vector asks for an Upgrade or CONNECT: those are handed to another server.

The vectors are written by kind: ``accepted.py`` (valid requests, pipelines, cuts across
writes), ``framing.py`` (where a body ends, smuggling forms), ``heads.py`` (the head, the bounds,
Expect); ``wire.py`` holds what they are built with. Importers take everything from here.
"""

from __future__ import annotations

from tests.h1_vectors import accepted, framing, heads
from tests.h1_vectors.wire import HEAD_BOUND, MAX_BODY_BYTES, Corpus, Family, Vector, get, post

__all__ = ["HEAD_BOUND", "MAX_BODY_BYTES", "VECTORS", "Family", "Vector", "get", "post"]


def _corpus() -> list[Vector]:
    corpus = Corpus()
    # In this order: test ids and the mutation test's sampling follow it.
    for kind in (accepted, framing, heads):
        kind.add_to(corpus)
    return corpus.vectors


VECTORS: tuple[Vector, ...] = tuple(_corpus())
