"""Gemini request translation (``providers/gemini_request.py``): the branches and messages that
the dialect tests reach with one typical value only.

Written for mutation testing (docs/testing.md): each case pins what Gemini is sent or what the
client is told (the error's message and ``param``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import GatewayError, InvalidRequest, UnsupportedParameter
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.gemini.request import build_body, function_response, int32_seed

GEMINI = ProviderConfig(name="gem", type="gemini", model="gemini-2.5-flash", api_key_env="K")
USER = {"role": "user", "content": "hi"}


def contents_for(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    request = validate_chat_body({"model": "alias", "messages": [USER, *messages]})
    contents: list[dict[str, Any]] = build_body(request, GEMINI)["contents"]
    return contents


def error_for(*messages: dict[str, Any]) -> GatewayError:
    request = validate_chat_body({"model": "alias", "messages": [USER, *messages]})
    with pytest.raises(GatewayError) as caught:
        build_body(request, GEMINI)
    return caught.value


# --- assistant messages ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [("function_call", {"name": "f", "arguments": "{}"}), ("audio", {"id": "audio_1"})],
)
def test_an_assistant_message_field_gemini_cannot_take(key: str, value: object) -> None:
    error = error_for({"role": "assistant", "content": "x", key: value})
    assert isinstance(error, UnsupportedParameter)
    assert error.message == f"an assistant message's {key!r} cannot be sent to gemini"
    assert error.param == f"messages[1].{key}"


@pytest.mark.parametrize(
    ("content", "refusal", "texts"),
    [
        ("said", None, ["said"]),
        ("", None, []),
        ("", "no", ["no"]),
        ("said", "no", ["said"]),
        ([{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}], None, ["a", "b"]),
        ([{"type": "text", "text": ""}, {"type": "refusal", "refusal": "r"}], None, ["r"]),
        ([{"type": "text", "text": ""}], "no", ["no"]),
        ([{"type": "text", "text": "a"}], "no", ["a"]),
        (None, "", []),
    ],
)
def test_assistant_texts(content: object, refusal: str | None, texts: list[str]) -> None:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if refusal is not None:
        message["refusal"] = refusal
    if not texts:
        message["tool_calls"] = [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]
    contents = contents_for(message)
    parts = contents[1]["parts"] if len(contents) > 1 else []
    assert [part["text"] for part in parts if "text" in part] == texts


# --- file parts --------------------------------------------------------------------------------


def file_message(file: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "file", "file": file}]}


def test_a_file_id_is_refused_with_its_param() -> None:
    error = error_for(file_message({"file_id": "file-1"}))
    assert isinstance(error, UnsupportedParameter)
    assert error.message == "gemini cannot read OpenAI file ids; send the file inline as file_data"
    assert error.param == "messages[1].content[0].file"


def test_a_file_as_a_data_url_keeps_its_type() -> None:
    contents = contents_for(file_message({"file_data": "data:text/plain;base64,aGk="}))
    assert contents[0]["parts"][1] == {"inlineData": {"mimeType": "text/plain", "data": "aGk="}}


def test_bare_base64_file_data_is_a_pdf() -> None:
    contents = contents_for(file_message({"file_data": "JVBERg=="}))
    assert contents[0]["parts"][1] == {
        "inlineData": {"mimeType": "application/pdf", "data": "JVBERg=="}
    }


def test_file_data_that_is_not_base64_names_its_param() -> None:
    error = error_for(file_message({"file_data": "not base64!"}))
    assert isinstance(error, InvalidRequest)
    assert error.param == "messages[1].content[0].file.file_data"


# --- tool results ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "response"),
    [
        ('  {"a": 1}', {"a": 1}),
        ('{"a": 1}  ', {"a": 1}),
        ([{"type": "text", "text": '{"a":'}, {"type": "text", "text": " 1}"}], {"a": 1}),
        ([{"type": "text", "text": "x"}, {"type": "text", "text": "y"}], {"output": "xy"}),
        ("{not json", {"output": "{not json"}),
        ("[1, 2]", {"output": "[1, 2]"}),
        ("", {"output": ""}),
    ],
)
def test_function_response(content: object, response: dict[str, Any]) -> None:
    assert function_response(content) == response


# --- the seed ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "folded"),
    [(0, 0), (5, 5), (-5, -5), (2**31 - 1, 2**31 - 1), (2**31, -(2**31)), (2**32 + 7, 7)],
)
def test_int32_seed_is_an_int(seed: int, folded: int) -> None:
    assert int32_seed(seed) == folded
    assert json.dumps(int32_seed(seed)) == str(folded)


# --- refusals ----------------------------------------------------------------------------------


def test_audio_that_is_not_base64_names_its_param() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}
    error = error_for({"role": "user", "content": [audio]})
    assert isinstance(error, InvalidRequest)
    assert error.param == "messages[1].content[0].input_audio.data"


@pytest.mark.parametrize(
    ("fields", "message", "param"),
    [
        ({"functions": [{"name": "f"}]}, "'functions' cannot be sent to gemini", "functions"),
        ({"modalities": ["text", "audio"]}, "the gateway cannot answer with audio", "modalities"),
        ({"top_k": -2}, "'top_k' must be a positive integer, or -1 for off", "top_k"),
        ({"top_k": "5"}, "'top_k' must be a positive integer, or -1 for off", "top_k"),
    ],
)
def test_refused_fields(fields: dict[str, Any], message: str, param: str) -> None:
    request = validate_chat_body({"model": "alias", "messages": [USER], **fields})
    with pytest.raises(GatewayError) as caught:
        build_body(request, GEMINI)
    assert (caught.value.message, caught.value.param) == (message, param)


@pytest.mark.parametrize(("top_k", "sent"), [(1, 1), (0, None), (-1, None)])
def test_top_k(top_k: int, sent: int | None) -> None:
    request = validate_chat_body({"model": "alias", "messages": [USER], "top_k": top_k})
    assert build_body(request, GEMINI).get("generationConfig", {}).get("topK") == sent


@pytest.mark.parametrize(
    ("messages", "message", "param"),
    [
        (
            [USER, {"role": "tool", "tool_call_id": "call_9", "content": "r"}],
            "no earlier assistant tool call has the id 'call_9'; "
            "gemini needs the function's name for its result",
            "messages[1].tool_call_id",
        ),
        (
            [USER, {"role": "function", "name": "f", "content": "x"}],
            "'function' messages cannot be sent to gemini; use tool messages",
            "messages[1].role",
        ),
        (
            [{"role": "system", "content": "s"}, {"role": "user", "content": ""}],
            "gemini needs at least one user or assistant message with content",
            "messages",
        ),
    ],
)
def test_message_refusals(messages: list[dict[str, Any]], message: str, param: str) -> None:
    request = validate_chat_body({"model": "alias", "messages": messages})
    with pytest.raises(GatewayError) as caught:
        build_body(request, GEMINI)
    assert (caught.value.message, caught.value.param) == (message, param)
