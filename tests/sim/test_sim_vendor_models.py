"""The simulator refuses what each cloud model refuses, by the model name it serves: OpenAI's
reasoning efforts and sampling fields, Gemini's thinking budgets and levels; the vendors' own
SDKs read those refusals as they read the vendors'."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import trio
from google import genai
from google.genai import errors, types

from trio_gateway.sim import SimConfig
from trio_gateway.sim.anthropic_request import parse_messages_request
from trio_gateway.sim.errors import ApiError
from trio_gateway.sim.gemini_wire import parse_generate_request, parse_route
from trio_gateway.sim.openai_wire import parse_openai_request

from .conftest import StartSim

KEY = "sk-test"


def openai_answer(model: str, **fields: Any) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}
    config = SimConfig(dialect="openai", served_model_name=model)
    return parse_openai_request(json.dumps(body).encode(), config)


@pytest.mark.parametrize(
    ("model", "fields", "message", "param", "code"),
    [
        (
            "gpt-5.1",
            {"reasoning_effort": "minimal"},
            "Unsupported value: 'minimal' is not supported with the 'gpt-5.1' model. Supported "
            "values are: 'none', 'low', 'medium', and 'high'.",
            "reasoning_effort",
            "unsupported_value",
        ),
        (
            "gpt-5.1-2025-11-13",
            {"reasoning_effort": "minimal"},
            "is not supported with the 'gpt-5.1' model",
            "reasoning_effort",
            "unsupported_value",
        ),
        (
            "o3-mini",
            {"reasoning_effort": "minimal"},
            "Unsupported value: 'reasoning_effort' does not support 'minimal' with this model. "
            "Supported values are: 'low', 'medium', and 'high'.",
            "reasoning_effort",
            "unsupported_value",
        ),
        (
            "gpt-5",
            {"reasoning_effort": "none"},
            "does not support 'none' with this model",
            "reasoning_effort",
            "unsupported_value",
        ),
        (
            "gpt-5-pro",
            {"reasoning_effort": "low"},
            "Supported values are: 'high'.",
            "reasoning_effort",
            "unsupported_value",
        ),
        (
            "gpt-4o",
            {"reasoning_effort": "low"},
            "Unsupported parameter: 'reasoning_effort' is not supported with this model.",
            "reasoning_effort",
            "unsupported_parameter",
        ),
        (
            "gpt-5-mini",
            {"temperature": 0.5},
            "Unsupported value: 'temperature' does not support 0.5 with this model. Only the "
            "default (1) value is supported.",
            "temperature",
            "unsupported_value",
        ),
        (
            "gpt-5.1",
            {"reasoning_effort": "low", "top_p": 0.9},
            "'top_p' does not support 0.9",
            "top_p",
            "unsupported_value",
        ),
        (
            "o4-mini",
            {"presence_penalty": 0.5},
            "Unsupported parameter: 'presence_penalty' is not supported with this model.",
            "presence_penalty",
            "unsupported_parameter",
        ),
        (
            "gpt-4o",
            {"max_completion_tokens": 20000},
            "max_tokens is too large: 20000. This model supports at most 16384 completion tokens",
            "max_tokens",
            "invalid_value",
        ),
    ],
)
def test_openai_models_refuse_what_they_do_not_take(
    model: str, fields: dict[str, Any], message: str, param: str, code: str
) -> None:
    error = openai_answer(model, **fields)
    assert isinstance(error, ApiError), error
    assert error.status == 400
    inner = error.body["error"]
    assert message in inner["message"]
    assert (inner["param"], inner["code"], inner["type"]) == (
        param,
        code,
        "invalid_request_error",
    )


@pytest.mark.parametrize(
    ("model", "fields", "thinks"),
    [
        ("gpt-5.1", {}, False),  # gpt-5.1 reasons only when asked to
        ("gpt-5.1", {"reasoning_effort": "none", "temperature": 0.2}, False),
        ("gpt-5.1", {"reasoning_effort": "high"}, True),
        ("gpt-5", {"reasoning_effort": "minimal", "temperature": 1}, True),
        ("o3", {"reasoning_effort": "low"}, True),
        ("gpt-4o", {"temperature": 0.2}, False),
        ("qwen3-32b", {"reasoning_effort": "minimal", "temperature": 0.2}, True),
    ],
)
def test_openai_models_take_what_they_document(
    model: str, fields: dict[str, Any], thinks: bool
) -> None:
    request = openai_answer(model, **fields)
    assert not isinstance(request, ApiError), request
    assert request.thinking is thinks


def gemini_answer(model: str, thinking: dict[str, Any]) -> Any:
    route = parse_route(f"/v1beta/models/{model}:streamGenerateContent")
    assert route is not None
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generationConfig": {"thinkingConfig": thinking},
    }
    config = SimConfig(dialect="gemini", served_model_name=model)
    return parse_generate_request(json.dumps(body).encode(), config, route, signing_key=b"k")


@pytest.mark.parametrize(
    ("model", "thinking", "message"),
    [
        (
            "gemini-2.5-pro",
            {"thinkingBudget": 0},
            "Budget 0 is invalid. This model only works in thinking mode.",
        ),
        (
            "gemini-2.5-pro-preview-06-05",
            {"thinkingBudget": 64},
            "The thinking budget 64 is invalid. Please choose a value between 128 and 32768.",
        ),
        (
            "gemini-2.5-flash",
            {"thinkingLevel": "LOW"},
            "Thinking level is not supported for this model.",
        ),
        (
            "gemini-3-pro-preview",
            {"thinkingBudget": 0},
            "Budget 0 is invalid. This model only works in thinking mode.",
        ),
        (
            "gemini-3-pro-preview",
            {"thinkingLevel": "MINIMAL"},
            "Thinking level MINIMAL is not supported for this model.",
        ),
    ],
)
def test_gemini_models_refuse_what_they_do_not_take(
    model: str, thinking: dict[str, Any], message: str
) -> None:
    error = gemini_answer(model, thinking)
    assert isinstance(error, ApiError), error
    assert error.status == 400
    assert error.body["error"]["status"] == "INVALID_ARGUMENT"
    assert error.body["error"]["message"] == message


@pytest.mark.parametrize(
    ("model", "thinking", "thinks"),
    [
        ("gemini-2.5-pro", {"thinkingBudget": 128}, True),
        ("gemini-2.5-pro", {"includeThoughts": True}, True),
        ("gemini-2.5-flash", {"thinkingBudget": 0}, False),
        ("gemini-2.5-flash-lite", {"thinkingBudget": 0}, False),
        ("gemini-3-pro-preview", {"thinkingLevel": "LOW", "includeThoughts": True}, True),
        ("gemini-3-flash-preview", {"thinkingLevel": "MINIMAL"}, False),
        ("gemini-sim", {"thinkingBudget": 0}, False),
    ],
)
def test_gemini_models_take_what_they_document(
    model: str, thinking: dict[str, Any], thinks: bool
) -> None:
    request = gemini_answer(model, thinking)
    assert not isinstance(request, ApiError), request
    assert request.chat.thinking is thinks


async def test_the_openai_sdk_reads_a_models_refusal(start_sim: StartSim) -> None:
    sim = await start_sim(dialect="openai", served_model_name="gpt-5.1", api_key=KEY)

    def run() -> Any:
        client = openai.OpenAI(base_url=sim.base_url + "/v1", api_key=KEY, max_retries=0)
        return client.chat.completions.create(
            model="gpt-5.1",
            messages=[{"role": "user", "content": "hi"}],
            reasoning_effort="minimal",
        )

    with pytest.raises(openai.BadRequestError) as refused:
        await trio.to_thread.run_sync(run)
    assert refused.value.code == "unsupported_value"
    assert refused.value.param == "reasoning_effort"
    assert "not supported with the 'gpt-5.1' model" in refused.value.message


async def test_the_genai_sdk_reads_a_models_refusal(start_sim: StartSim) -> None:
    model = "gemini-2.5-pro"
    sim = await start_sim(dialect="gemini", served_model_name=model, api_key=KEY)

    def run() -> Any:
        options = types.HttpOptions(
            base_url=sim.base_url, retry_options=types.HttpRetryOptions(attempts=1)
        )
        client = genai.Client(api_key=KEY, http_options=options)
        config = types.GenerateContentConfig(
            thinking_config=types.ThinkingConfig(thinking_budget=0)
        )
        return client.models.generate_content(model=model, contents="hi", config=config)

    with pytest.raises(errors.ClientError) as refused:
        await trio.to_thread.run_sync(run)
    assert refused.value.code == 400
    assert refused.value.status == "INVALID_ARGUMENT"
    assert refused.value.message == "Budget 0 is invalid. This model only works in thinking mode."


@pytest.mark.parametrize(
    ("model", "refused"),
    [("claude-sonnet-4-5-20250929", True), ("claude-haiku-4-5", True), ("claude-sonnet-4", False)],
)
def test_the_newer_claude_models_refuse_temperature_with_top_p(model: str, refused: bool) -> None:
    body = {
        "model": model,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
        "top_p": 0.9,
    }
    config = SimConfig(dialect="anthropic", served_model_name=model)
    answer = parse_messages_request(json.dumps(body).encode(), config, version=b"2023-06-01")
    if not refused:
        assert not isinstance(answer, ApiError), answer
        return
    assert isinstance(answer, ApiError)
    assert answer.status == 400
    assert answer.body["error"] == {
        "type": "invalid_request_error",
        "message": "`temperature` and `top_p` cannot both be specified for this model. Please "
        "use only one.",
    }
