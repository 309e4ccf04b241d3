"""Request ids and W3C trace context: what joins a gateway request to the client's trace and to
the upstream's (vLLM joins its own OpenTelemetry spans to an incoming ``traceparent``).

Pure, apart from the random ids :func:`new_trace` and :meth:`TraceContext.child` draw.

A client's ``x-request-id`` is kept when it is short and made of safe characters (it goes into
log lines and headers); anything else is replaced by a fresh id. ``traceparent`` follows W3C
Trace Context level 1: ``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``, lowercase,
neither id all zeros. A malformed one starts a new trace, and its ``tracestate`` is dropped with
it (the spec ties the two together).
"""

from __future__ import annotations

import re
import secrets

import attrs

MAX_REQUEST_ID_CHARS = 128
# Letters, digits and the punctuation ids are made of (UUIDs, ULIDs, "svc:1234", base64url).
_REQUEST_ID = re.compile(rf"[A-Za-z0-9._:\-]{{1,{MAX_REQUEST_ID_CHARS}}}")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# The spec allows 32 list members of at most 256 characters; 512 is what it asks any vendor to
# propagate at least. Longer ones are dropped, not cut (a cut one would be malformed).
MAX_TRACESTATE_CHARS = 512
SAMPLED = "01"


def clean_request_id(raw: str | None) -> str | None:
    """The client's request id if it is safe to keep and echo, else None."""
    if raw is None or _REQUEST_ID.fullmatch(raw) is None:
        return None
    return raw


@attrs.frozen
class TraceContext:
    trace_id: str  # 32 lowercase hex digits
    parent_id: str  # 16: the span of whoever sends the request that carries this context
    flags: str  # 2
    tracestate: str | None = None

    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags}"

    def child(self) -> TraceContext:
        """The context for a call this span makes: same trace, a new span id."""
        # attrs.evolve reads the class's fields on every call: built directly, the same value.
        return TraceContext(self.trace_id, _span_id(), self.flags, self.tracestate)

    def headers(self) -> dict[str, str]:
        out = {"traceparent": self.traceparent()}
        if self.tracestate:
            out["tracestate"] = self.tracestate
        return out


def _span_id() -> str:
    while (span := secrets.token_hex(8)) == "0" * 16:
        pass
    return span


def new_trace() -> TraceContext:
    """A trace the gateway starts, sampled so that the upstream records it too."""
    # Both ids from one draw (one call for the random bytes, not two); neither may be all zeros.
    while True:
        ids = secrets.token_hex(24)
        trace, span = ids[:32], ids[32:]
        if trace != "0" * 32 and span != "0" * 16:
            return TraceContext(trace_id=trace, parent_id=span, flags=SAMPLED)


def parse_traceparent(traceparent: str | None, tracestate: str | None) -> TraceContext | None:
    """The client's trace context, or None when absent or malformed."""
    if traceparent is None:
        return None
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace_id, parent_id, flags = match.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    state = tracestate.strip() if tracestate is not None else None
    if not state or len(state) > MAX_TRACESTATE_CHARS:
        state = None
    return TraceContext(trace_id=trace_id, parent_id=parent_id, flags=flags, tracestate=state)


def trace_for(traceparent: str | None, tracestate: str | None) -> TraceContext:
    """The gateway's span of a request: a child of the client's trace, or a new trace."""
    incoming = parse_traceparent(traceparent, tracestate)
    return incoming.child() if incoming is not None else new_trace()
