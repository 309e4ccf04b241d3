"""A real OTLP/HTTP trace receiver for the tests: what a collector's ``otlphttp`` receiver
takes (``POST /v1/traces``, an ``ExportTraceServiceRequest`` in protobuf, gzip or not), decoded
with opentelemetry-proto's own messages.

A threading HTTP server, outside any trio loop: the gateway's exporter and a real vLLM send to
it from their own threads and processes, and a test that blocks the gateway's loop still sees
what arrived. It can answer slowly (``delay_s``: each export waits that long, or until the
receiver closes) or refuse (``status``).
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status


@attrs.frozen
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@attrs.frozen
class ReceivedSpan:
    """One span as the collector got it; ids in lowercase hex, as in a ``traceparent``."""

    service: str
    scope: str
    name: str
    kind: str  # "SERVER", "CLIENT", "INTERNAL"...
    trace_id: str
    span_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[SpanEvent, ...]
    status_code: str  # "UNSET", "OK", "ERROR"
    status_message: str

    def event(self, name: str) -> SpanEvent:
        found = [e for e in self.events if e.name == name]
        assert found, f"no {name!r} event in {[e.name for e in self.events]}"
        return found[0]

    def event_names(self) -> list[str]:
        return [e.name for e in self.events]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pair: KeyValue
    for pair in pairs:
        out[pair.key] = _value(pair.value)
    return out


def decode(body: bytes) -> list[ReceivedSpan]:
    """An export request's spans, flattened, each with its service's name."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    ReceivedSpan(
                        service=service,
                        scope=scope_spans.scope.name,
                        name=span.name,
                        kind=Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex() or None,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        events=tuple(
                            SpanEvent(e.name, e.time_unix_nano, _attributes(e.attributes))
                            for e in span.events
                        ),
                        status_code=Status.StatusCode.Name(span.status.code).removeprefix(
                            "STATUS_CODE_"
                        ),
                        status_message=span.status.message,
                    )
                )
    return out


class OtlpReceiver:
    """Serves ``/v1/traces`` on a free loopback port until closed."""

    def __init__(self, *, delay_s: float = 0.0, status: int = 200) -> None:
        self.delay_s = delay_s
        self.status = status
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests: list[dict[str, str]] = []  # each export's headers
        self._closing = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver._lock:
                    receiver.requests.append({k.lower(): v for k, v in self.headers.items()})
                if receiver.delay_s:
                    receiver._closing.wait(receiver.delay_s)
                if receiver.status != 200 or self.path != "/v1/traces":
                    self.send_response(receiver.status if self.path == "/v1/traces" else 404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                spans = decode(body)
                with receiver._lock:
                    receiver._spans.extend(spans)
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def exports(self) -> int:
        with self._lock:
            return len(self.requests)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def running_receiver(*, delay_s: float = 0.0, status: int = 200) -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver(delay_s=delay_s, status=status)
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.close()
