"""The simulated Gemini signs its function calls (``thoughtSignature``) when it thinks, and a
thinking model (Gemini 3) refuses, as Google documents, a function call of the current turn
sent back without its signature; the ``google-genai`` SDK reads the signed answer and sends it
back as is."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from google import genai
from google.genai import types

from trio_gateway.sim import SimConfig
from trio_gateway.sim.errors import ApiError
from trio_gateway.sim.gemini_request import parse_generate_request, parse_route

from .conftest import StartSim

MODEL = "gemini-3-pro-preview"
KEY = "AIza-test"
CONFIG = SimConfig(dialect="gemini", served_model_name=MODEL, max_model_len=4096)
ROUTE = parse_route(f"/v1beta/models/{MODEL}:generateContent")
CALL = {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}
RESULT = {"functionResponse": {"name": "get_weather", "response": {"output": "18C"}}}
QUESTION = {"role": "user", "parts": [{"text": "weather?"}]}


def signed(call: dict[str, Any], signature: str = "c2ln") -> dict[str, Any]:
    return call | {"thoughtSignature": signature}


def refusal(*contents: Any, model: str = MODEL) -> str | None:
    assert ROUTE is not None
    config = CONFIG if model == MODEL else SimConfig(dialect="gemini", served_model_name=model)
    route = parse_route(f"/v1beta/models/{model}:generateContent")
    assert route is not None
    raw = json.dumps({"contents": list(contents)}).encode()
    parsed = parse_generate_request(raw, config, route)
    if not isinstance(parsed, ApiError):
        return None
    assert parsed.status == 400
    assert parsed.body["error"]["status"] == "INVALID_ARGUMENT"
    message: str = parsed.body["error"]["message"]
    return message


def model(*parts: Any) -> dict[str, Any]:
    return {"role": "model", "parts": list(parts)}


def results(*parts: Any) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


ACCEPTED = [
    (QUESTION, model(signed(CALL)), results(RESULT)),
    # Parallel calls: only the first of a step is signed.
    (QUESTION, model({"text": "looking"}, signed(CALL), CALL), results(RESULT, RESULT)),
    # Every step of the current turn.
    (QUESTION, model(signed(CALL)), results(RESULT), model(signed(CALL)), results(RESULT)),
    # Google's placeholder for history it did not sign.
    (QUESTION, model(signed(CALL, "skip_thought_signature_validator")), results(RESULT)),
    # Earlier turns are not checked: a user's own words start a new turn.
    (QUESTION, model(CALL), results(RESULT), model({"text": "18C"}), QUESTION),
]


@pytest.mark.parametrize("contents", ACCEPTED)
def test_signed_calls_of_the_current_turn_are_accepted(contents: Any) -> None:
    assert refusal(*contents) is None


@pytest.mark.parametrize(
    ("contents", "position"),
    [
        ((QUESTION, model(CALL), results(RESULT)), 2),
        ((QUESTION, model(signed(CALL)), results(RESULT), model(CALL), results(RESULT)), 4),
        ((QUESTION, model(CALL, signed(CALL)), results(RESULT, RESULT)), 2),
    ],
)
def test_a_gemini_3_call_without_its_signature_is_refused(contents: Any, position: int) -> None:
    assert refusal(*contents) == (
        "Function call is missing a thought_signature in functionCall parts. This is required "
        "for tools to work correctly, and missing thought_signature may lead to degraded model "
        "performance. Additional data, function call `default_api:get_weather` , position "
        f"{position}. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures "
        "for more details."
    )


def test_earlier_models_take_an_unsigned_call() -> None:
    assert refusal(QUESTION, model(CALL), results(RESULT), model="gemini-2.5-flash") is None


async def test_the_sdk_sends_a_signed_call_back_and_the_loop_goes_on(start_sim: StartSim) -> None:
    sim = await start_sim(dialect="gemini", served_model_name=MODEL, api_key=KEY)
    steps = [
        {"reasoning": "look it up"},
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    ]
    question = f"weather? <sim>{json.dumps({'steps': steps})}</sim>"
    declaration = types.FunctionDeclaration(
        name="get_weather",
        parameters_json_schema={"type": "object", "properties": {"city": {"type": "string"}}},
    )
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[declaration])],
        thinking_config=types.ThinkingConfig(include_thoughts=True),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )

    def run() -> Any:
        options = types.HttpOptions(
            base_url=sim.base_url, retry_options=types.HttpRetryOptions(attempts=1)
        )
        sdk = genai.Client(api_key=KEY, http_options=options)
        user = types.Content(role="user", parts=[types.Part(text=question)])
        first = sdk.models.generate_content(model=MODEL, contents=[user], config=config)
        turn: Any = first.candidates[0].content  # type: ignore[index]
        signatures = [p.thought_signature for p in turn.parts if p.function_call]
        result = types.Part.from_function_response(name="get_weather", response={"output": "ok"})
        history = [user, turn, types.Content(role="user", parts=[result])]
        second = sdk.models.generate_content(model=MODEL, contents=history, config=config)
        # The same turn without its signature: what Gemini 3 refuses.
        for part in turn.parts:
            part.thought_signature = None
        with pytest.raises(genai.errors.ClientError) as refused:
            sdk.models.generate_content(model=MODEL, contents=history, config=config)
        return signatures, second, refused.value

    signatures, second, refused = await trio.to_thread.run_sync(run)
    assert len(signatures) == 1 and signatures[0]
    assert any(p.function_call for p in second.candidates[0].content.parts)
    assert refused.code == 400 and "missing a thought_signature" in str(refused.message)
