"""What the server should do with a vector, and whether a conversation did it: h11's framing
of the same bytes (``tests/h1_reference.py``), except where a deliberate difference
(``h1_differences.py``) makes the gateway refuse; and the problems of a conversation that does
not agree."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Literal

import attrs

from tests.e2e.h1_conversation import CONVERSATION_BOUND_S, SENTINEL, Conversation, Response
from tests.e2e.h1_differences import DIFFERENCES
from tests.h1_reference import Framed, Reference, frame_with_h11
from tests.h1_vectors import HEAD_BOUND, Vector

# What a framing error the client can still hear about is answered with (issue 26).
FRAMING_ERRORS = frozenset({400, 413, 431, 501, 505})


# --- what the server should do, and whether it did ----------------------------------------------


@attrs.frozen(kw_only=True)
class Expectation:
    answered: tuple[Framed, ...]  # echoed, in order, as h11 framed them
    # close: the last answered says connection: close, then EOF. refuse: then one error
    # response (connection: close) and EOF. open: h11 waits for more; the server may close at
    # its timeout, with or without one error response.
    end: Literal["close", "refuse", "open"]
    statuses: frozenset[int]  # with end "refuse"
    no_continue: bool
    because: str

    def describe(self) -> str:
        n = len(self.answered)
        if self.end == "refuse":
            return f"answer {n}, refuse {'/'.join(map(str, sorted(self.statuses)))}"
        return f"answer {n}, {self.end}"


def reference(vector: Vector) -> Reference:
    return frame_with_h11(vector.data + SENTINEL, max_head_bytes=HEAD_BOUND)


def expect(ref: Reference) -> Expectation:
    for i, request in enumerate(ref.requests):
        hits = [d for d in DIFFERENCES if d.applies(request)]
        if i == ref.refused_at:
            break  # h11 refuses it itself (a head refused has no Framed at all)
        if hits:
            return Expectation(
                answered=ref.requests[:i],
                end="refuse",
                statuses=frozenset().union(*(d.statuses for d in hits)),
                no_continue=any(d.no_continue for d in hits),
                because="differs: " + ", ".join(d.name for d in hits),
            )
    else:
        hits = []
    if ref.verdict == "refused":
        return Expectation(
            answered=ref.complete,
            end="refuse",
            statuses=FRAMING_ERRORS,
            no_continue=any(d.no_continue for d in hits),
            because=f"h11: {ref.status_hint} {ref.error}",
        )
    return Expectation(
        answered=ref.complete,
        end="close" if ref.verdict == "closed" else "open",
        statuses=frozenset(),
        no_continue=False,
        because=f"h11: {ref.verdict}",
    )


def same_target(framed: bytes, seen: bytes) -> bool:
    """The echoed target is h11's; for an absolute-form one, its origin form will do too
    (ASGI's raw_path is the path only)."""
    if seen == framed:
        return True
    absolute = re.match(rb"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*", framed)
    return absolute is not None and seen == (framed[absolute.end() :] or b"/")


def echo_problem(request: Framed, response: Response) -> str | None:
    if response.status != 200:
        return f"status {response.status}"
    try:
        seen = json.loads(response.body)
    except ValueError:
        return f"not an echo: {response.body[:80]!r}"
    want = {
        "method": request.method.decode("latin-1"),
        "version": request.http_version.decode("latin-1"),
        "length": len(request.body),
        "sha256": hashlib.sha256(request.body).hexdigest(),
    }
    got = {key: seen.get(key) for key in want}
    if got != want:
        return f"echoed {got}, h11 framed {want}"
    if not same_target(request.target, str(seen.get("target")).encode("latin-1")):
        return f"target {seen.get('target')!r}, h11 framed {request.target!r}"
    return None


def judge(expectation: Expectation, conversation: Conversation) -> list[str]:
    """What the server did that the expectation does not allow (nothing: it agrees)."""
    problems: list[str] = []
    finals = conversation.finals
    answered = expectation.answered
    for i, request in enumerate(answered):
        if i >= len(finals):
            what = f"{request.method.decode('latin-1')} {request.target[:40].decode('latin-1')}"
            problems.append(f"request #{i} ({what}) not answered")
            break
        problem = echo_problem(request, finals[i])
        if problem is not None:
            problems.append(f"request #{i}: {problem}")
    extra = finals[len(answered) :]
    if expectation.end == "close" and extra:
        problems.append(f"{len(extra)} more answered than h11 framed")
    elif expectation.end == "refuse":
        if len(extra) != 1:
            problems.append(f"{len(extra)} responses where one refusal was due")
        elif extra[0].status not in expectation.statuses:
            problems.append(f"refused with {extra[0].status}")
    elif expectation.end == "open" and (len(extra) > 1 or (extra and extra[0].status < 400)):
        problems.append("answered more than h11 framed")
    for response in finals[:-1]:
        if response.closes:
            problems.append("went on after a response that said connection: close")
    if finals and expectation.end != "open" and not finals[-1].closes:
        problems.append(f"the last response ({finals[-1].status}) does not say connection: close")
    if extra and expectation.end == "open" and not extra[0].closes:
        problems.append(f"the error ({extra[0].status}) does not say connection: close")
    if expectation.no_continue:
        # After the answers to the requests before it, no 100 for the one refused.
        seen = 0
        for at, response in enumerate(conversation.responses):
            if seen == len(answered):
                if any(r.status == 100 for r in conversation.responses[at:]):
                    problems.append("a 100 Continue before the refusal of the body")
                break
            seen += response.status >= 200
    if conversation.ended == "timeout":
        problems.append(f"no end of the connection within {CONVERSATION_BOUND_S} s")
    if conversation.garbage:
        problems.append(f"not a response: {conversation.garbage[:60]!r}")
    return problems
