"""One trace from the agent through the gateway to a real vLLM (issue 44): vLLM 0.32 started with
``--otlp-traces-endpoint`` at the test's OTLP receiver, the gateway with ``[tracing]`` at the
same one, and the test as the agent, with a span of its own made by OpenTelemetry's SDK. The
receiver decodes what each sends (tests/otlp_receiver.py); one trace holds all four spans,
each the parent of the next."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tests.e2e.harness import provider_toml, running_gateway, wait_until
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan, running_receiver
from tests.vllm.helpers import ALIAS, KEY_ENV, PROVIDER, chat
from tests.vllm.vllm_server import VllmServer, running_vllm
from trio_gateway.config.load import parse_config

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def traced_vllm() -> Iterator[tuple[OtlpReceiver, VllmServer]]:
    """A vLLM of its own that exports its spans to the receiver: over OTLP/HTTP, which vLLM
    0.32 uses when told so (its default is gRPC)."""
    if os.environ.get("TRIO_GATEWAY_VLLM_URL"):
        pytest.skip("needs a vLLM started with --otlp-traces-endpoint, not an external one")
    with (
        running_receiver() as receiver,
        running_vllm(
            extra_args=["--otlp-traces-endpoint", receiver.url],
            env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
        ) as server,
    ):
        yield receiver, server


def of_trace(receiver: OtlpReceiver, trace_id: str) -> list[ReceivedSpan]:
    return [s for s in receiver.spans() if s.trace_id == trace_id]


async def test_one_trace_holds_the_agent_the_gateway_its_attempt_and_vllm(
    traced_vllm: tuple[OtlpReceiver, VllmServer],
) -> None:
    receiver, server = traced_vllm
    agent = TracerProvider(resource=Resource.create({"service.name": "test-agent"}))
    agent.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.url)))
    provider = provider_toml(PROVIDER, server.root_url, alias=ALIAS, api_key_env=KEY_ENV)
    config = parse_config(
        f'[server]\nlisten = "127.0.0.1:0"\n\n[tracing]\notlp_endpoint = "{receiver.url}"\n'
        f"export_interval_s = 0.2\n\n[aliases.{ALIAS}]\n{provider}",
        source="vllm-traces.toml",
        environ={KEY_ENV: server.api_key},
    )
    async with running_gateway(config) as gateway:
        tracer = agent.get_tracer("test-agent")
        with tracer.start_as_current_span("agent turn", kind=SpanKind.CLIENT) as turn:
            headers: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(headers)
            async with httpx.AsyncClient(base_url=gateway.base_url, timeout=120) as client:
                response = await client.post(
                    "/v1/chat/completions",
                    json=chat(max_tokens=8, chat_template_kwargs={"enable_thinking": False}),
                    headers=headers,
                )
            assert response.status_code == 200, response.text
        trace_id = f"{turn.get_span_context().trace_id:032x}"
        # vLLM exports from its own batch processor (5 s schedule): allow it a few.
        await wait_until(lambda: len(of_trace(receiver, trace_id)) >= 4, timeout_s=60)
    agent.shutdown()
    spans = {s.service: s for s in of_trace(receiver, trace_id) if s.service != "trio-gateway"}
    ours = [s for s in of_trace(receiver, trace_id) if s.service == "trio-gateway"]
    client_span = spans["test-agent"]
    (vllm_span,) = [s for s in of_trace(receiver, trace_id) if s.name == "llm_request"]
    (server_span,) = [s for s in ours if s.kind == "SERVER"]
    (attempt,) = [s for s in ours if s.kind == "CLIENT"]
    # The chain: agent -> gateway request -> gateway attempt -> vLLM's request.
    assert client_span.parent_id is None
    assert server_span.parent_id == client_span.span_id
    assert attempt.parent_id == server_span.span_id
    assert vllm_span.parent_id == attempt.span_id
    assert vllm_span.kind == "SERVER"
    # The same request, as each side counted it.
    usage = response.json()["usage"]
    assert server_span.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert vllm_span.attributes["gen_ai.usage.completion_tokens"] == usage["completion_tokens"]
    assert server_span.attributes["gen_ai.response.model"] == server.served_model_name
    assert attempt.attributes["http.response.status_code"] == 200
    # vLLM's request began within the gateway's attempt (one clock: one machine).
    assert attempt.start_ns <= vllm_span.start_ns <= attempt.end_ns
