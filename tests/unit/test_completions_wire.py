"""The OpenAI wire of /v1/completions and /v1/embeddings, both ways: the upstream calls each
dialect builds, real vLLM 0.32.0 answers read into events (transcripts from the real-vLLM
tier), the vendors' refusals, and the events written back as the SDK reads them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.endpoints import parse_completions_request, parse_embeddings_request
from trio_gateway.core.errors import (
    InvalidRequest,
    QuotaExhausted,
    UnsupportedEndpoint,
    UpstreamProtocolError,
    UpstreamServerError,
)
from trio_gateway.core.events import (
    CompletionText,
    Embeddings,
    Event,
    ResponseDone,
    ResponseStarted,
    Usage,
)
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.sse import SSEEvent
from trio_gateway.fronts.completion_chunks import (
    CompletionAccumulator,
    CompletionChunkEncoder,
    EmbeddingsAccumulator,
)
from trio_gateway.providers.anthropic.dialect import AnthropicDialect
from trio_gateway.providers.gemini.dialect import GeminiDialect
from trio_gateway.providers.openai.dialect import OpenAIDialect
from trio_gateway.providers.openai_compatible.dialect import OpenAICompatibleDialect
from trio_gateway.providers.openai_compatible.endpoints import (
    CompletionParser,
    KindReader,
    parse_embeddings,
    parse_whole_completion,
)

CHOICE = {"logprobs": None, "stop_reason": None, "prompt_token_ids": None, "token_ids": None}
HEAD = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "qwen3-32b"}
# Two prompts, max_tokens 2, continuous usage: vLLM interleaves the choices.
TWO_PROMPTS = [
    {**HEAD, "choices": [{"index": 0, "text": "京", "finish_reason": None, **CHOICE}],
     "usage": {"prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1}},
    {**HEAD, "choices": [{"index": 1, "text": "sw", "finish_reason": None, **CHOICE}],
     "usage": {"prompt_tokens": 1, "total_tokens": 2, "completion_tokens": 1}},
    {**HEAD, "choices": [{"index": 0, "text": ",", "finish_reason": "length", **CHOICE}],
     "usage": {"prompt_tokens": 2, "total_tokens": 4, "completion_tokens": 2}},
    {**HEAD, "choices": [{"index": 1, "text": "\u0019", "finish_reason": "length", **CHOICE}],
     "usage": {"prompt_tokens": 1, "total_tokens": 3, "completion_tokens": 2}},
    {**HEAD, "choices": [],
     "usage": {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4,
               "prompt_tokens_details": {"cached_tokens": 0}},
     "system_fingerprint": "vllm-0.32.0-3fefdd46"},
]  # fmt: skip
WHOLE = {
    **HEAD,
    "choices": [
        {"index": 0, "text": "", "finish_reason": "length", **CHOICE},
        {"index": 1, "text": "heme", "finish_reason": "length", **CHOICE},
    ],
    "usage": {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4,
              "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": None},
              "completion_tokens_details": None},
}  # fmt: skip


def sse(obj: Any) -> SSEEvent:
    return SSEEvent(data=obj if isinstance(obj, bytes) else json.dumps(obj).encode())


def test_a_stream_of_two_prompts_becomes_their_choices_and_usage() -> None:
    parser = CompletionParser("vllm")
    events = [e for chunk in TWO_PROMPTS for e in parser.feed(sse(chunk))]
    events += parser.feed(sse(b"[DONE]"))
    assert events == [
        ResponseStarted("vllm"),
        CompletionText(0, "京"),
        CompletionText(1, "sw"),
        CompletionText(0, ",", "length"),
        CompletionText(1, "\u0019", "length"),
        Usage(3, 4, None, 0),
        ResponseDone("length"),
    ]
    assert parser.done and parser.close() == []


def test_a_cut_stream_is_billed_from_its_last_cumulative_usage() -> None:
    parser = CompletionParser("vllm")
    assert parser.usage_so_far() is None
    for chunk in TWO_PROMPTS[:2]:
        parser.feed(sse(chunk))
    partial = parser.usage_so_far()
    assert partial is not None and (partial.usage.completion_tokens, partial.estimated) == (
        1,
        False,
    )
    plain = CompletionParser("openai")  # no continuous usage: a token per fragment
    plain.feed(sse({**HEAD, "choices": [{"index": 0, "text": "a"}]}))
    plain.feed(sse({**HEAD, "choices": [{"index": 0, "text": "b"}]}))
    partial = plain.usage_so_far()
    assert partial is not None and (partial.usage.completion_tokens, partial.estimated) == (2, True)
    with pytest.raises(UpstreamProtocolError, match="before the answer finished"):
        plain.close()


@pytest.mark.parametrize(
    "chunk",
    [
        b"not json",
        [1],
        {"choices": {"index": 0}},
        {"choices": [{"index": -1, "text": "a"}]},
        {"choices": [{"index": "0", "text": "a"}]},
        {"choices": [{"index": 0, "text": 5}]},
        {"choices": [{"index": 0, "text": "a", "finish_reason": 1}]},
    ],
)
def test_malformed_chunks_are_protocol_errors(chunk: Any) -> None:
    with pytest.raises(UpstreamProtocolError):
        CompletionParser("p").feed(sse(chunk))


def test_in_band_errors_and_an_end_without_finish() -> None:
    with pytest.raises(InvalidRequest):
        CompletionParser("p").feed(sse({"error": {"message": "bad", "code": 400}}))
    parser = CompletionParser("p")
    parser.feed(sse({"choices": [{"index": 0, "text": "a"}]}))
    with pytest.raises(UpstreamProtocolError, match="without a finish_reason"):
        parser.feed(sse(b"[DONE]"))


def test_a_whole_completion_reads_as_its_stream_would() -> None:
    events = parse_whole_completion("vllm", json.dumps(WHOLE).encode())
    assert events == [
        ResponseStarted("vllm"),
        CompletionText(0, "", "length"),
        CompletionText(1, "heme", "length"),
        Usage(3, 4, None, 0),
        ResponseDone("length"),
    ]
    with pytest.raises(UpstreamProtocolError):
        parse_whole_completion("vllm", b'{"object": "list"}')


def test_embeddings_come_back_in_input_order_with_their_usage() -> None:
    body = {
        "object": "list",
        "data": [
            {"index": 1, "object": "embedding", "embedding": "AACAPw=="},
            {"index": 0, "object": "embedding", "embedding": [0.5, -0.5]},
        ],
        "usage": {"prompt_tokens": 4, "total_tokens": 4, "completion_tokens": 0},
    }
    events = parse_embeddings("vllm", json.dumps(body).encode())
    assert events == [
        ResponseStarted("vllm"),
        Embeddings(([0.5, -0.5], "AACAPw==")),
        Usage(4, 0),
        ResponseDone("stop"),
    ]
    broken_bodies: list[Any] = [
        {"data": [{"index": 1, "embedding": []}]},
        {"data": [{"index": 0, "embedding": 3}]},
        {"data": [{"embedding": []}]},
        {"object": "list"},
    ]
    for broken in broken_bodies:
        with pytest.raises(UpstreamProtocolError):
            parse_embeddings("vllm", json.dumps(broken).encode())


def provider(kind: Any = "openai_compatible", **fields: Any) -> ProviderConfig:
    return ProviderConfig(name="p", type=kind, model="served", base_url="http://h/v1", **fields)


def completion(**fields: Any) -> ChatRequest:
    body = {"model": "alias", "prompt": "hi", **fields}
    return parse_completions_request(json.dumps(body).encode())


def embedding(**fields: Any) -> ChatRequest:
    body = {"model": "alias", "input": "hi", **fields}
    return parse_embeddings_request(json.dumps(body).encode())


def test_vllm_is_asked_to_stream_a_completion_with_usage_and_not_an_embedding() -> None:
    dialect = OpenAICompatibleDialect()
    call = dialect.build_call(completion(top_k=5, user="u", max_tokens=9), provider())
    assert call.url == "http://h/v1/completions" and call.reader is not None
    assert json.loads(call.body) == {
        "prompt": "hi",
        "top_k": 5,
        "max_tokens": 9,
        "model": "served",
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    call = dialect.build_call(embedding(truncate_prompt_tokens=8), provider())
    assert call.url == "http://h/v1/embeddings" and call.headers["accept"] == "application/json"
    assert json.loads(call.body) == {"input": "hi", "truncate_prompt_tokens": 8, "model": "served"}
    assert call.max_whole_bytes is not None and call.max_whole_bytes > 16 * 2**20


def test_openai_gets_only_its_own_fields() -> None:
    dialect = OpenAIDialect()
    call = dialect.build_call(completion(top_k=5, suffix="s"), provider("openai"))
    assert json.loads(call.body) == {
        "prompt": "hi",
        "suffix": "s",
        "model": "served",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    call = dialect.build_call(embedding(dimensions=8, truncate_prompt_tokens=8), provider("openai"))
    assert json.loads(call.body) == {"input": "hi", "dimensions": 8, "model": "served"}


@pytest.mark.parametrize(
    ("dialect", "kind"),
    [(AnthropicDialect(), "anthropic"), (GeminiDialect(), "gemini")],
)
def test_other_vendors_refuse_before_any_call(dialect: Any, kind: str) -> None:
    for request in (completion(), embedding()):
        with pytest.raises(UnsupportedEndpoint):
            dialect.build_call(request, provider(kind))


def test_a_model_without_the_endpoint_is_the_requests_fault_not_the_providers() -> None:
    reader = KindReader(*_kind_and_classify(OpenAICompatibleDialect()))
    missing = reader.classify_error("p", 404, b'{"detail":"Not Found"}', {})
    assert isinstance(missing, UnsupportedEndpoint) and "/v1/embeddings" in missing.message
    chat_model = reader.classify_error(
        "p",
        404,
        b'{"error":{"message":"This is a chat model and not supported in the v1/completions '
        b'endpoint.","type":"invalid_request_error","param":"model","code":null}}',
        {},
    )
    assert isinstance(chat_model, UnsupportedEndpoint)
    no_model = b'{"error":{"message":"The model `x` does not exist.","code":404}}'
    assert isinstance(reader.classify_error("p", 404, no_model, {}), UpstreamServerError)
    refused = b'{"error":{"message":"The decoder prompt cannot be empty","code":400}}'
    assert isinstance(reader.classify_error("p", 400, refused, {}), InvalidRequest)
    openai = KindReader(*_kind_and_classify(OpenAIDialect()))
    quota = b'{"error":{"message":"no","code":"insufficient_quota"}}'
    assert isinstance(openai.classify_error("p", 429, quota, {}), QuotaExhausted)


def _kind_and_classify(dialect: OpenAICompatibleDialect) -> tuple[Any, Any]:
    call = dialect.build_call(embedding(), provider())
    assert isinstance(call.reader, KindReader)
    return call.reader._kind, call.reader._classify


def test_streamed_chunks_are_text_completions_with_usage_when_asked() -> None:
    encoder = CompletionChunkEncoder(
        completion_id="cmpl-x", created=7, model="alias", include_usage=True
    )
    events: list[Event] = [
        ResponseStarted("p"),
        CompletionText(0, "Hi"),
        CompletionText(0, "!", "stop"),
        Usage(3, 2),
        ResponseDone("stop"),
    ]
    out = b"".join(encoder.encode(e) for e in events).decode()
    frames = [f[len("data: ") :] for f in out.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "text": "Hi", "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": "!", "logprobs": None, "finish_reason": "stop"}],
        [],
    ]
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert {(c["id"], c["object"], c["model"]) for c in chunks} == {
        ("cmpl-x", "text_completion", "alias")
    }
    quiet = CompletionChunkEncoder(completion_id="c", created=7, model="a", include_usage=False)
    assert b"usage" not in b"".join(quiet.encode(e) for e in events)


def test_whole_answers_gather_each_choice_and_each_vector() -> None:
    whole = CompletionAccumulator(completion_id="cmpl-x", created=7, model="alias")
    for event in parse_whole_completion("p", json.dumps(WHOLE).encode()):
        whole.add(event)
    body = whole.result()
    assert whole.finish_reason == "length"
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "", "length"),
        (1, "heme", "length"),
    ]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    vectors = EmbeddingsAccumulator(model="alias")
    for event in (Embeddings(([1.0], "AACAPw==")), Usage(2, 0), ResponseDone("stop")):
        vectors.add(event)
    assert vectors.result() == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [1.0]},
            {"object": "embedding", "index": 1, "embedding": "AACAPw=="},
        ],
        "model": "alias",
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
    }
