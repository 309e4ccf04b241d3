"""The bodies of /v1/completions and /v1/embeddings: OpenAI's checks, the prompt's estimate,
what admission reserves for each kind, and which providers routing lets serve them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.accounting.admission import local_limits
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import AliasConfig, ConfigError, ProviderConfig
from trio_gateway.core.endpoints import (
    MAX_INPUTS,
    parse_completions_request,
    parse_embeddings_request,
    prompt_count,
)
from trio_gateway.core.errors import GatewayError, InvalidJSON, UnsupportedEndpoint
from trio_gateway.core.keys import ApiKey
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.usage import estimate_input_tokens
from trio_gateway.dispatch.routing import eligible_providers


def raw(**fields: Any) -> bytes:
    return json.dumps({"model": "a", **fields}).encode()


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [("hello", 1), (["a", "b"], 2), ([1, 2, 3], 1), ([[1, 2], [3]], 2), ("", 1)],
)
def test_completions_take_openais_four_prompt_forms(prompt: Any, prompts: int) -> None:
    request = parse_completions_request(
        raw(prompt=prompt, stream=True, stream_options={"include_usage": True})
    )
    assert (request.kind, request.alias, request.stream, request.include_usage) == (
        RequestKind.COMPLETIONS,
        "a",
        True,
        True,
    )
    assert prompt_count(request) == prompts


COMPLETIONS_REFUSED: list[tuple[dict[str, Any], str, str | None]] = [
    ({}, "invalid_request", "prompt"),
    ({"prompt": None}, "invalid_request", "prompt"),
    ({"prompt": 5}, "invalid_request", "prompt"),
    ({"prompt": []}, "invalid_request", "prompt"),
    ({"prompt": ["a", 1]}, "invalid_request", "prompt[1]"),
    ({"prompt": [1, "a"]}, "invalid_request", "prompt[1]"),
    ({"prompt": [1, True]}, "invalid_request", "prompt[1]"),
    ({"prompt": [-1]}, "invalid_request", "prompt[0]"),
    ({"prompt": [[]]}, "invalid_request", "prompt[0]"),
    ({"prompt": [[1], ["x"]]}, "invalid_request", "prompt[1][0]"),
    ({"prompt": ["x"] * (MAX_INPUTS + 1)}, "invalid_request", "prompt"),
    ({"prompt": "x", "stream": "yes"}, "invalid_request", "stream"),
    (
        {"prompt": "x", "stream_options": {"include_usage": True}},
        "invalid_request",
        "stream_options",
    ),
    ({"prompt": "x", "max_tokens": -1}, "invalid_request", "max_tokens"),
    ({"prompt": "x", "n": 0}, "invalid_request", "n"),
    ({"prompt": "x", "temperature": 3}, "invalid_request", "temperature"),
    ({"prompt": "x", "stop": [1]}, "invalid_request", "stop[0]"),
    ({"prompt": "x", "logprobs": 1}, "unsupported_parameter", "logprobs"),
    ({"prompt": "x", "logprobs": 9}, "invalid_request", "logprobs"),
]


@pytest.mark.parametrize(("fields", "code", "param"), COMPLETIONS_REFUSED)
def test_completions_refusals_name_the_param(
    fields: dict[str, Any], code: str, param: str | None
) -> None:
    with pytest.raises(GatewayError) as refused:
        parse_completions_request(raw(**fields))
    assert (refused.value.code, refused.value.param, refused.value.status) == (code, param, 400)


def test_a_body_that_is_not_an_object_or_json_is_refused() -> None:
    with pytest.raises(InvalidJSON):
        parse_completions_request(b"{")
    with pytest.raises(GatewayError) as no_model:
        parse_embeddings_request(b'{"input": "x"}')
    assert no_model.value.param == "model"
    with pytest.raises(GatewayError) as nested:
        parse_completions_request(raw(prompt="x", extra=json.loads("[" * 70 + "]" * 70)))
    assert nested.value.code == "invalid_request" and "nested too deeply" in nested.value.message


EMBEDDINGS_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({}, "input"),
    ({"input": ""}, "input"),
    ({"input": ["a", ""]}, "input[1]"),
    ({"input": []}, "input"),
    ({"input": {"a": 1}}, "input"),
    ({"input": ["a"] * (MAX_INPUTS + 1)}, "input"),
    ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "user": 1}, "user"),
]


@pytest.mark.parametrize(("fields", "param"), EMBEDDINGS_REFUSED)
def test_embeddings_refusals_name_the_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as refused:
        parse_embeddings_request(raw(**fields))
    assert (refused.value.code, refused.value.param) == ("invalid_request", param)


def test_embeddings_never_stream_and_estimate_their_input() -> None:
    request = parse_embeddings_request(raw(input=["abcdefgh", "abcdefghijkl"], stream=True))
    assert (request.kind, request.stream) == (RequestKind.EMBEDDINGS, False)
    assert request.prompt_estimate() == 2 + 3
    request.release_body()  # the estimate outlives the body
    assert (request.body, request.prompt_estimate()) == ({}, 5)


def test_input_tokens_are_estimated_per_form() -> None:
    assert estimate_input_tokens("abcde") == 2
    assert estimate_input_tokens(["abcd", "abcd"]) == 2
    assert estimate_input_tokens([7, 8, 9]) == 3
    assert estimate_input_tokens([[7, 8], [9]]) == 3
    assert estimate_input_tokens(None) == 0


@pytest.mark.parametrize(
    ("kind", "body", "tokens"),
    [
        # A completion without max_tokens generates at most the vendors' default of 16.
        (RequestKind.COMPLETIONS, {"prompt": [1, 2, 3]}, 3 + 16),
        (RequestKind.COMPLETIONS, {"prompt": [1, 2, 3], "max_tokens": 40}, 3 + 40),
        # Each prompt, n times, is a choice that may generate max_tokens.
        (RequestKind.COMPLETIONS, {"prompt": [[1, 2], [3]], "n": 2, "max_tokens": 5}, 3 + 20),
        # An embedding generates nothing: its input is all it costs.
        (RequestKind.EMBEDDINGS, {"input": [1, 2, 3]}, 3),
    ],
)
async def test_admission_reserves_what_the_kind_may_use(
    kind: RequestKind, body: dict[str, object], tokens: int
) -> None:
    limits = local_limits()
    key = ApiKey(name="alice", digest=b"", tpm=1000)
    admission = await limits.admit(key, body, (), kind)
    assert admission is not None
    remaining = dict(admission.headers)[b"x-ratelimit-remaining-tokens"]
    assert int(remaining) == 1000 - tokens


def provider(name: str, kind: Any) -> ProviderConfig:
    return ProviderConfig(name=name, type=kind, model="m", base_url="http://h/v1")


def test_routing_keeps_the_providers_that_speak_the_endpoint() -> None:
    alias = AliasConfig(
        providers=(provider("claude", "anthropic"), provider("vllm", "openai_compatible"))
    )
    chat = eligible_providers("a", alias, frozenset())
    assert [p.name for p in chat] == ["claude", "vllm"]
    for kind in (RequestKind.COMPLETIONS, RequestKind.EMBEDDINGS):
        assert [p.name for p in eligible_providers("a", alias, frozenset(), kind)] == ["vllm"]
    cloud = AliasConfig(providers=(provider("claude", "anthropic"), provider("g", "gemini")))
    with pytest.raises(UnsupportedEndpoint) as refused:
        eligible_providers("cloud", cloud, frozenset(), RequestKind.EMBEDDINGS)
    assert refused.value.status == 400 and refused.value.code == "unsupported_endpoint"
    assert "claude is anthropic, g is gemini" in refused.value.message
    assert "/v1/embeddings" in refused.value.message


def test_probe_endpoint_is_for_openai_wire_providers_only() -> None:
    def config(kind: str, probe_endpoint: str) -> str:
        return (
            '[aliases.a]\n[[aliases.a.providers]]\nname = "p"\n'
            f'type = "{kind}"\nmodel = "m"\nbase_url = "http://h/v1"\napi_key_env = "K"\n'
            f'probe_endpoint = "{probe_endpoint}"\n'
        )

    vllm = parse_config(config("openai_compatible", "embeddings"), source="t", environ={"K": "k"})
    assert vllm.aliases["a"].providers[0].probe_endpoint == "embeddings"
    with pytest.raises(ConfigError) as refused:
        parse_config(config("anthropic", "completions"), source="t", environ={"K": "k"})
    assert refused.value.problems == [
        "aliases.a.providers[0].probe_endpoint: 'completions' only for types "
        "'openai_compatible' and 'openai'"
    ]
    with pytest.raises(ConfigError):
        parse_config(config("openai", "images"), source="t", environ={"K": "k"})
