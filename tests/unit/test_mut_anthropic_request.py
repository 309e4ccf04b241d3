"""Anthropic request translation (``providers/anthropic_request.py``) and the OpenAI dialect's
body and call (``providers/openai.py``): each refusal's message and param, and the branches the
dialect tests reach with one typical value.

Written for mutation testing (docs/testing.md).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import (
    GatewayError,
    InvalidRequest,
    QuotaExhausted,
    UnsupportedParameter,
    UpstreamServerError,
)
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.anthropic.request import build_body, tool_use_id
from trio_gateway.providers.openai.dialect import OpenAIDialect
from trio_gateway.providers.openai.dialect import build_body as openai_body

CLAUDE = ProviderConfig(name="claude", type="anthropic", model="claude-sonnet-4-5")
USER = {"role": "user", "content": "hi"}


def translate(**fields: Any) -> dict[str, Any]:
    request = validate_chat_body({"model": "alias", "messages": [USER], **fields})
    return build_body(request, CLAUDE)


def refused(**fields: Any) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        translate(**fields)
    return caught.value


def check(error: GatewayError, kind: type[GatewayError], message: str, param: str) -> None:
    assert type(error) is kind
    assert (error.message, error.param) == (message, param)


# --- messages ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [("function_call", {"name": "f", "arguments": "{}"}), ("audio", {"id": "audio_1"})],
)
def test_an_assistant_field_anthropic_cannot_take(key: str, value: object) -> None:
    error = refused(messages=[USER, {"role": "assistant", "content": "x", key: value}])
    message = f"an assistant message's {key!r} cannot be sent to anthropic"
    check(error, UnsupportedParameter, message, f"messages[1].{key}")


@pytest.mark.parametrize(
    ("content", "refusal", "texts"),
    [
        ([{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}], None, ["a", "b"]),
        ([{"type": "refusal", "refusal": "r"}], None, ["r"]),
        ("said", "no", ["said"]),
        ("", "no", ["no"]),
    ],
)
def test_assistant_texts(content: object, refusal: str | None, texts: list[str]) -> None:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if refusal is not None:
        message["refusal"] = refusal
    out = translate(messages=[USER, message, USER])
    blocks = out["messages"][1]["content"]
    assert [block["text"] for block in blocks if block["type"] == "text"] == texts


def file_part(file: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "file", "file": file}]}]


def test_a_file_id_is_refused() -> None:
    error = refused(messages=file_part({"file_id": "file-1"}))
    message = "anthropic cannot read OpenAI file ids; send the file inline as file_data"
    check(error, UnsupportedParameter, message, "messages[0].content[0].file")


def test_a_file_that_is_not_a_pdf_is_refused() -> None:
    error = refused(messages=file_part({"file_data": "data:text/plain;base64,aGk="}))
    message = "anthropic reads PDF files only, not text/plain"
    check(error, UnsupportedParameter, message, "messages[0].content[0].file.file_data")


def test_file_data_that_is_not_base64_names_its_param() -> None:
    error = refused(messages=file_part({"file_data": "not base64!"}))
    assert isinstance(error, InvalidRequest)
    assert error.param == "messages[0].content[0].file.file_data"


def test_a_content_part_anthropic_cannot_take() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "aGk=", "format": "wav"}}
    error = refused(messages=[{"role": "user", "content": [audio]}])
    message = "anthropic does not accept 'input_audio' content parts"
    check(error, UnsupportedParameter, message, "messages[0].content[0].type")


def test_nothing_to_send() -> None:
    error = refused(messages=[{"role": "system", "content": "s"}, {"role": "user", "content": ""}])
    message = "anthropic needs at least one user or assistant message with content"
    check(error, InvalidRequest, message, "messages")


def test_a_function_message_is_refused() -> None:
    error = refused(messages=[USER, {"role": "function", "name": "f", "content": "x"}])
    message = "'function' messages cannot be sent to anthropic; use tool messages"
    check(error, UnsupportedParameter, message, "messages[1].role")


def test_an_empty_tool_call_id() -> None:
    assert tool_use_id("") == "_"
    assert tool_use_id("call.1/ä") == "call_1__"


# --- fields ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message", "param"),
    [
        ({"functions": [{"name": "f"}]}, "'functions' cannot be sent to anthropic", "functions"),
        ({"modalities": ["text", "audio"]}, "anthropic cannot answer with audio", "modalities"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "anthropic needs the JSON schema itself to constrain the output",
            "response_format.json_schema.schema",
        ),
        (
            {"top_k": -2},
            "'top_k' must be a positive integer, or -1 for off",
            "top_k",
        ),
    ],
)
def test_refused_fields(fields: dict[str, Any], message: str, param: str) -> None:
    error = refused(**fields)
    assert (error.message, error.param) == (message, param)


@pytest.mark.parametrize(("top_k", "sent"), [(1, 1), (0, None), (-1, None)])
def test_top_k(top_k: int, sent: int | None) -> None:
    assert translate(top_k=top_k).get("top_k") == sent


# --- the OpenAI dialect ------------------------------------------------------------------------

OPENAI = ProviderConfig(
    name="oai",
    type="openai",
    model="gpt-x",
    api_key_env="K",
    capabilities=frozenset({Capability.REASONING}),
)
PLAIN = ProviderConfig(name="oai", type="openai", model="gpt-x", api_key_env="K")


def openai_for(provider: ProviderConfig, **fields: Any) -> dict[str, Any]:
    request = validate_chat_body({"model": "alias", "messages": [USER], **fields})
    return openai_body(request, provider)


def test_reasoning_effort_none_is_kept() -> None:
    body = openai_for(OPENAI, reasoning=False, reasoning_effort="none")
    assert body["reasoning_effort"] == "none"
    # A model of no known family is sent no effort of the gateway's own (model_rules.py).
    assert "reasoning_effort" not in openai_for(OPENAI, reasoning=False)


def test_no_reasoning_field_for_a_model_that_cannot_reason() -> None:
    assert "reasoning_effort" not in openai_for(PLAIN)
    assert "reasoning_effort" not in openai_for(PLAIN, reasoning_effort="high")


def test_openai_call() -> None:
    request = validate_chat_body({"model": "alias", "messages": [{"role": "user", "content": "é"}]})
    call = OpenAIDialect().build_call(request, PLAIN)
    assert '"content": "é"'.encode() in call.body
    assert dict(call.headers) == {"content-type": "application/json", "accept": "text/event-stream"}


def test_openai_errors_name_the_provider() -> None:
    body = json.dumps({"error": {"message": "no money", "code": "insufficient_quota"}}).encode()
    quota = OpenAIDialect().classify_error("oai", 429, body, {})
    assert type(quota) is QuotaExhausted
    assert quota.message == "oai: the OpenAI account has no quota left: no money"
    assert quota.provider == "oai"
    other = OpenAIDialect().classify_error("oai", 500, b"{}", {})
    assert type(other) is UpstreamServerError
    assert other.provider == "oai"
