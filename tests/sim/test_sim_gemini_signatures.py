"""The simulated Gemini signs its function calls (``thoughtSignature``) when it thinks, and
refuses, as Google does, a signature it did not issue or that was altered (from any turn, any
model) and, for a thinking model (Gemini 3), a function call of the current turn sent back
without its signature; the ``google-genai`` SDK reads the signed answer and sends it back as
is."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import trio
from google import genai
from google.genai import types

from trio_gateway.sim import SimConfig
from trio_gateway.sim.errors import ApiError
from trio_gateway.sim.gemini_request import parse_generate_request, parse_route
from trio_gateway.sim.gemini_signatures import new_key, sign

from .conftest import StartSim

MODEL = "gemini-3-pro-preview"
KEY = "AIza-test"
CONFIG = SimConfig(dialect="gemini", served_model_name=MODEL, max_model_len=4096)
SIGNING_KEY = new_key()
OWN = sign(SIGNING_KEY, "one answer")
CALL = {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}
RESULT = {"functionResponse": {"name": "get_weather", "response": {"output": "18C"}}}
QUESTION = {"role": "user", "parts": [{"text": "weather?"}]}
CORRUPTED = "Corrupted thought signature."
VERTEX_INVALID = (
    "Unable to submit request because Thought signature is not valid.. Learn more: "
    "https://cloud.google.com/vertex-ai/generative-ai/docs/model-reference/gemini"
)


def signed(call: dict[str, Any], signature: str = OWN) -> dict[str, Any]:
    return call | {"thoughtSignature": signature}


def refusal(*contents: Any, model: str = MODEL, vertex: bool = False) -> str | None:
    config = CONFIG if model == MODEL else SimConfig(dialect="gemini", served_model_name=model)
    path = f"/v1beta/models/{model}:generateContent"
    if vertex:
        path = f"/v1/projects/p/locations/global/publishers/google/models/{model}:generateContent"
    route = parse_route(path)
    assert route is not None and route.vertex is vertex
    raw = json.dumps({"contents": list(contents)}).encode()
    parsed = parse_generate_request(raw, config, route, signing_key=SIGNING_KEY)
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


def altered(signature: str) -> str:
    """The same signature with one byte changed, still valid base64."""
    raw = bytearray(base64.b64decode(signature))
    raw[-1] ^= 1
    return base64.b64encode(bytes(raw)).decode()


ACCEPTED = [
    (QUESTION, model(signed(CALL)), results(RESULT)),
    # Parallel calls: only the first of a step is signed.
    (QUESTION, model({"text": "looking"}, signed(CALL), CALL), results(RESULT, RESULT)),
    # Every step of the current turn.
    (QUESTION, model(signed(CALL)), results(RESULT), model(signed(CALL)), results(RESULT)),
    # Google's placeholders for history it did not sign.
    (QUESTION, model(signed(CALL, "skip_thought_signature_validator")), results(RESULT)),
    (QUESTION, model(signed(CALL, "context_engineering_is_the_way_to_go")), results(RESULT)),
    # The same bytes in proto-JSON's other spelling: URL-safe, unpadded.
    (
        QUESTION,
        model(signed(CALL, base64.urlsafe_b64encode(base64.b64decode(OWN)).decode().rstrip("="))),
        results(RESULT),
    ),
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


BAD_SIGNATURES = {
    "altered": altered(OWN),
    "another simulator's": sign(new_key(), "one answer"),
    "made up": base64.b64encode(b"sig").decode(),
    "cut short": OWN[:-8],
}


@pytest.mark.parametrize("signature", BAD_SIGNATURES.values(), ids=BAD_SIGNATURES.keys())
@pytest.mark.parametrize("vertex", [False, True], ids=["ai-studio", "vertex"])
def test_a_signature_it_did_not_issue_is_refused(signature: str, vertex: bool) -> None:
    expected = VERTEX_INVALID if vertex else CORRUPTED
    assert refusal(QUESTION, model(signed(CALL, signature)), results(RESULT), vertex=vertex) == (
        expected
    )


@pytest.mark.parametrize("name", [MODEL, "gemini-2.5-flash"])
def test_a_bad_signature_in_an_earlier_turn_is_refused_by_any_model(name: str) -> None:
    # Not the missing-signature rule (Gemini 3's, current turn only): every signature is read.
    earlier = model(signed(CALL, altered(OWN)))
    contents = (QUESTION, earlier, results(RESULT), model({"text": "18C"}), QUESTION)
    assert refusal(*contents, model=name) == CORRUPTED


def test_a_bad_signature_on_a_text_part_is_refused() -> None:
    answer = model({"text": "18C", "thoughtSignature": altered(OWN)})
    assert refusal(QUESTION, answer, QUESTION) == CORRUPTED


@pytest.mark.parametrize("value", ["not base64!", 7])
def test_a_signature_that_is_not_base64_fails_the_parse(value: Any) -> None:
    shown = value if isinstance(value, str) else json.dumps(value)
    assert refusal(QUESTION, model(signed(CALL, value)), results(RESULT)) == (
        "Invalid value at 'contents[1].parts[0].thought_signature' (TYPE_BYTES), Base64 "
        f'decoding failed for "{shown}"'
    )


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
        # The same turn with its signature changed, then without it: what Gemini 3 refuses.
        refusals = []
        for signature in (signatures[0][:-1] + bytes([signatures[0][-1] ^ 1]), None):
            for part in turn.parts:
                if part.function_call:
                    part.thought_signature = signature
            with pytest.raises(genai.errors.ClientError) as refused:
                sdk.models.generate_content(model=MODEL, contents=history, config=config)
            refusals.append(refused.value)
        return signatures, second, refusals

    signatures, second, (corrupted, missing) = await trio.to_thread.run_sync(run)
    assert len(signatures) == 1 and signatures[0]
    assert any(p.function_call for p in second.candidates[0].content.parts)
    assert corrupted.code == 400 and corrupted.status == "INVALID_ARGUMENT"
    assert corrupted.message == CORRUPTED
    assert missing.code == 400 and "missing a thought_signature" in str(missing.message)
