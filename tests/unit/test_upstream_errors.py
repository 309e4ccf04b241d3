"""Error classification: every provider's wording of a situation → one gateway code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trio_gateway.core.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotServed,
    UpstreamAuthFailed,
    UpstreamOverloaded,
    UpstreamRateLimited,
    UpstreamServerError,
    UpstreamTimeout,
)
from trio_gateway.providers.errors import classify_inband, classify_status, parse_retry_after

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"


def vllm_400(message: str, param: str = "input_tokens") -> bytes:
    error = {"message": message, "type": "BadRequestError", "param": param, "code": 400}
    return json.dumps({"error": error}).encode()


CONTEXT_BODIES = [
    # vLLM 0.32 (the fixture's wording)
    vllm_400(
        "This model's maximum context length is 2048 tokens. However, your prompt contains at "
        "least 2049 input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the length of the input prompt. (parameter=input_tokens, value=2049)"
    ),
    # older vLLM wordings
    vllm_400(
        "This model's maximum context length is 40960 tokens. However, you requested 0 output "
        "tokens and your prompt contains at least 40961 input tokens"
    ),
    vllm_400("The prompt (total length 5000) is longer than the maximum model length of 4096."),
    vllm_400("Input too long: the context length is only 4096 tokens", param="input_text"),
    # OpenAI
    json.dumps(
        {
            "error": {
                "message": "This model's maximum context length is 128000 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    ).encode(),
    # Anthropic
    json.dumps(
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 208656 tokens > 200000 maximum",
            },
        }
    ).encode(),
    # Gemini / Vertex
    json.dumps(
        {
            "error": {
                "code": 400,
                "message": "The input token count (3475108) exceeds the maximum number of "
                "tokens allowed (1048576).",
                "status": "INVALID_ARGUMENT",
            }
        }
    ).encode(),
]


@pytest.mark.parametrize("body", CONTEXT_BODIES)
def test_every_context_length_wording_is_context_length_exceeded(body: bytes) -> None:
    error = classify_status("vllm-a", 400, body)
    assert isinstance(error, ContextLengthExceeded)
    assert error.status == 400
    assert error.code == "context_length_exceeded"
    assert error.provider == "vllm-a"


def test_the_recorded_vllm_body_is_context_length_exceeded() -> None:
    text = (FIXTURES / "d_too_long_stream_True.json").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#")).encode()
    assert isinstance(classify_status("v", 400, body), ContextLengthExceeded)


@pytest.mark.parametrize(
    ("status", "body", "retry_after", "kind", "retry_after_s"),
    [
        (
            400,
            vllm_400("max_tokens=3000 cannot be greater than max_model_len=2048.", "max_tokens"),
            None,
            InvalidRequest,
            None,
        ),
        (401, b'{"error":"Unauthorized"}', None, UpstreamAuthFailed, None),
        (429, b'{"error":{"message":"slow down"}}', "7", UpstreamRateLimited, 7.0),
        (
            529,
            b'{"type":"error","error":{"type":"overloaded_error"}}',
            "3",
            UpstreamOverloaded,
            3.0,
        ),
        (500, b"Internal Server Error", None, UpstreamServerError, None),
        (503, b"", "2", UpstreamServerError, 2.0),
        (504, b"gateway timeout", None, UpstreamTimeout, None),
        (
            404,
            b'{"error":{"message":"The model `x` does not exist."}}',
            None,
            ModelNotServed,
            None,
        ),
    ],
)
def test_status_classification(
    status: int,
    body: bytes,
    retry_after: str | None,
    kind: type[GatewayError],
    retry_after_s: float | None,
) -> None:
    error = classify_status("p", status, body, retry_after)
    assert type(error) is kind
    assert error.retry_after_s == retry_after_s
    assert "p" in (error.provider or "")


def test_request_faults_are_not_retryable_and_provider_faults_are() -> None:
    assert not classify_status("p", 400, vllm_400("bad", "x")).retryable
    assert classify_status("p", 502, b"").retryable


def test_inband_errors() -> None:
    assert isinstance(
        classify_inband("p", {"message": "maximum context length is 10", "code": 400}),
        ContextLengthExceeded,
    )
    assert isinstance(
        classify_inband("p", {"message": "engine died", "code": 500}), UpstreamServerError
    )
    assert isinstance(classify_inband("p", "boom"), UpstreamServerError)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, None), ("3", 3.0), (" 1.5 ", 1.5), ("-1", None), ("Wed, 21 Oct", None)],
)
def test_retry_after(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds
