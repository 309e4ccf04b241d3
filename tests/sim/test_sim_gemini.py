"""The `gemini` dialect: pure request checks, then the google-genai SDK (sync client in a
worker thread) against a real simulator, as AI Studio and as Vertex AI with a service account
whose tokens come from the simulator's own `POST /token`."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google import genai
from google.genai import errors, types
from google.oauth2 import service_account

from trio_gateway.sim import SimConfig
from trio_gateway.sim.errors import ApiError
from trio_gateway.sim.gemini_wire import parse_generate_request, parse_route

from .conftest import StartSim

MODEL = "gemini-sim"
KEY = "AIza-test"
DEADLINE_S = 10
CONFIG = SimConfig(dialect="gemini", served_model_name=MODEL, max_model_len=4096)
ROUTE = parse_route(f"/v1beta/models/{MODEL}:generateContent")
WEATHER: Any = {
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}},
}


def scripted(*steps: Any) -> str:
    return f"go <sim>{json.dumps({'steps': list(steps)})}</sim>"


def body(**fields: Any) -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": "hello"}]}], **fields}


def parse(value: Any) -> Any:
    assert ROUTE is not None
    return parse_generate_request(json.dumps(value).encode(), CONFIG, ROUTE, signing_key=b"k")


# ---- pure: request checks ------------------------------------------------------------------


def test_routes() -> None:
    studio = parse_route("/v1/models/m:streamGenerateContent")
    assert studio is not None and studio.stream and not studio.vertex
    vertex = parse_route(
        "/v1/projects/p/locations/us-east1/publishers/google/models/m:generateContent"
    )
    assert (
        vertex is not None
        and vertex.vertex
        and (vertex.project, vertex.location)
        == (
            "p",
            "us-east1",
        )
    )
    assert parse_route("/v1/models/m:countTokens") is None


def _schema_tool(parameters: Any) -> dict[str, Any]:
    return {"functionDeclarations": [{"name": "f", "parameters": parameters}]}


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        (body(temperature=1), 'Unknown name "temperature": Cannot find field.'),
        (
            body(generationConfig={"maxTokens": 5}),
            "Unknown name \"maxTokens\" at 'generation_config': Cannot find field.",
        ),
        (
            body(contents=[{"role": "user", "parts": [{"text": "a", "image": 1}]}]),
            "Unknown name \"image\" at 'contents[0].parts[0]'",
        ),
        (body(tools=[{"functions": []}]), "Unknown name \"functions\" at 'tools[0]'"),
        (
            body(tools=[_schema_tool({"type": "object", "additionalProperties": False})]),
            'Unknown name "additionalProperties" at '
            "'tools[0].function_declarations[0].parameters': Cannot find field.",
        ),
        (body(tools=[_schema_tool({"$schema": "x", "type": "object"})]), 'Unknown name "$schema"'),
        (
            body(tools=[_schema_tool({"type": "object", "properties": {"a": {"const": 1}}})]),
            'Unknown name "const"',
        ),
        (
            body(tools=[_schema_tool({"type": ["string", "null"]})]),
            "Proto field is not repeating, cannot start list.",
        ),
        (
            body(contents=[{"role": "assistant", "parts": [{"text": "a"}]}]),
            "valid role: user, model",
        ),
        (body(contents=[{"role": "user", "parts": [{}]}]), "required oneof field 'data'"),
        (body(contents=[]), "contents is not specified"),
        (
            body(
                tools=[{"functionDeclarations": [WEATHER]}],
                toolConfig={
                    "functionCallingConfig": {"mode": "AUTO", "allowedFunctionNames": ["f"]}
                },
            ),
            "only allowed when mode is ANY",
        ),
        (
            body(
                generationConfig={"thinkingConfig": {"thinkingBudget": 10, "thinkingLevel": "LOW"}}
            ),
            "thinking_budget and thinking_level",
        ),
        (
            body(contents=[{"role": "user", "parts": [{"text": "word " * 5000}]}]),
            "The input token count (5010) exceeds the maximum number of tokens allowed (4096).",
        ),
    ],
)
def test_bad_requests_are_refused(request_body: Any, message: str) -> None:
    error = parse(request_body)
    assert isinstance(error, ApiError), error
    assert error.status == 400
    assert error.body["error"]["status"] == "INVALID_ARGUMENT"
    assert error.body["error"]["code"] == 400
    assert message in error.body["error"]["message"]


def test_good_requests_are_accepted() -> None:
    full_schema = {
        "type": "object",
        "properties": {"a": {"type": ["string", "null"], "const": "x"}},
        "additionalProperties": False,
        "$schema": "https://json-schema.org/draft/2020-12/schema",
    }
    good = [
        body(systemInstruction={"parts": [{"text": "be brief"}]}),
        body(system_instruction={"parts": [{"text": "snake case is proto JSON too"}]}),
        body(
            tools=[{"functionDeclarations": [{"name": "f", "parametersJsonSchema": full_schema}]}]
        ),
        body(
            tools=[{"functionDeclarations": [WEATHER]}],
            toolConfig={"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        ),
        body(
            generationConfig={"thinkingConfig": {"thinkingLevel": "LOW", "includeThoughts": True}}
        ),
        body(
            contents=[
                {
                    "role": "user",
                    "parts": [
                        {"text": "what is this"},
                        {"inlineData": {"mimeType": "image/png", "data": "AA=="}},
                        {"fileData": {"mimeType": "video/mp4", "fileUri": "gs://b/v.mp4"}},
                    ],
                },
                {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}]},
                {
                    "role": "user",
                    "parts": [{"functionResponse": {"name": "f", "response": {"ok": True}}}],
                },
            ]
        ),
    ]
    for request_body in good:
        parsed = parse(request_body)
        assert not isinstance(parsed, ApiError), (request_body, parsed)


def test_thinking_defaults_on_and_budget_zero_turns_it_off() -> None:
    on = parse(body())
    off = parse(body(generationConfig={"thinkingConfig": {"thinkingBudget": 0}}))
    assert not isinstance(on, ApiError) and not isinstance(off, ApiError)
    assert on.chat.thinking and not on.include_thoughts
    assert not off.chat.thinking


# ---- the SDK against a real simulator ------------------------------------------------------


def studio(base_url: str, version: str = "v1beta", key: str = KEY) -> genai.Client:
    options = types.HttpOptions(
        base_url=base_url,
        api_version=version,
        timeout=DEADLINE_S * 1000,
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    return genai.Client(api_key=key, http_options=options)


def tool_config(**thinking: Any) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**WEATHER)])],
        thinking_config=types.ThinkingConfig(**thinking),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )


async def start(start_sim: StartSim, **fields: Any) -> Any:
    fields = {"dialect": "gemini", "served_model_name": MODEL, "api_key": KEY, **fields}
    return await start_sim(**fields)


STEPS = (
    {"reasoning": "let me think"},
    {"text": "Hello 世界 🌍"},
    {"tool_call": {"name": "get_weather", "arguments": {"city": "Parés"}}},
)


@pytest.mark.parametrize("version", ["v1beta", "v1"])
async def test_sdk_streams_thoughts_text_and_function_calls(
    start_sim: StartSim, version: str
) -> None:
    sim = await start(start_sim)

    def run() -> Any:
        # Keep the client referenced: collecting it closes its connection mid-stream.
        sdk = studio(sim.base_url, version)
        return list(
            sdk.models.generate_content_stream(
                model=MODEL, contents=scripted(*STEPS), config=tool_config(include_thoughts=True)
            )
        )

    chunks = await trio.to_thread.run_sync(run)
    parts = [p for c in chunks for p in c.candidates[0].content.parts]
    thoughts = "".join(p.text or "" for p in parts if p.thought)
    text = "".join(p.text or "" for p in parts if not p.thought)
    calls = [p.function_call for p in parts if p.function_call]
    assert thoughts == "let me think" and text == "Hello 世界 🌍"
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].args == {"city": "Parés"} and calls[0].id is None
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    # usageMetadata is cumulative: it only grows, and the last one has it all.
    totals = [c.usage_metadata.total_token_count for c in chunks]
    assert totals == sorted(totals)
    usage = chunks[-1].usage_metadata
    assert usage is not None and usage.thoughts_token_count == 3
    assert usage.total_token_count == (
        usage.prompt_token_count + usage.candidates_token_count + usage.thoughts_token_count
    )


async def test_sdk_whole_answer_hides_thoughts_but_counts_them(start_sim: StartSim) -> None:
    sim = await start(start_sim)
    sdk = studio(sim.base_url)  # referenced: collecting a Client closes its connections

    def run(**thinking: Any) -> Any:
        return sdk.models.generate_content(
            model=MODEL, contents=scripted(*STEPS), config=tool_config(**thinking)
        )

    hidden = await trio.to_thread.run_sync(run)
    parts = hidden.candidates[0].content.parts
    assert [bool(p.thought) for p in parts] == [False, False]
    assert hidden.text == "Hello 世界 🌍"
    assert hidden.function_calls[0].args == {"city": "Parés"}
    assert hidden.usage_metadata.thoughts_token_count == 3
    off = await trio.to_thread.run_sync(lambda: run(thinking_budget=0))
    assert off.usage_metadata.thoughts_token_count is None

    def cut() -> Any:
        config = types.GenerateContentConfig(max_output_tokens=3)
        return sdk.models.generate_content(model=MODEL, contents="hello", config=config)

    short = await trio.to_thread.run_sync(cut)
    assert short.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS


async def test_sdk_reads_a_scripted_vendor_finish_reason(start_sim: StartSim) -> None:
    """`vendor_finish` sends Gemini's own finishReason, streamed or whole, as the SDK knows it."""
    sim = await start(start_sim)
    sdk = studio(sim.base_url)  # referenced: collecting a Client closes its connections
    malformed = scripted({"text": "a"}, {"vendor_finish": "MALFORMED_FUNCTION_CALL"})

    def run() -> Any:
        chunks = list(sdk.models.generate_content_stream(model=MODEL, contents=malformed))
        whole = sdk.models.generate_content(
            model=MODEL, contents=scripted({"vendor_finish": "TOO_MANY_TOOL_CALLS"})
        )
        return chunks, whole

    chunks, whole = await trio.to_thread.run_sync(run)
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.MALFORMED_FUNCTION_CALL
    assert whole.candidates[0].finish_reason == types.FinishReason.TOO_MANY_TOOL_CALLS


async def test_sdk_raises_google_errors(start_sim: StartSim, client: httpx.AsyncClient) -> None:
    sim = await start(start_sim, max_model_len=256)
    clients = {KEY: studio(sim.base_url), "wrong-key": studio(sim.base_url, key="wrong-key")}

    def call(contents: str, key: str = KEY) -> None:
        clients[key].models.generate_content(model=MODEL, contents=contents)

    cases = [
        (
            scripted({"status": 429, "retry_after": 2}),
            errors.ClientError,
            429,
            "RESOURCE_EXHAUSTED",
        ),
        (scripted({"status": 503}), errors.ServerError, 503, "UNAVAILABLE"),
        ("w " * 300, errors.ClientError, 400, "INVALID_ARGUMENT"),
    ]
    for contents, error_class, code, status in cases:
        with pytest.raises(error_class) as info:
            await trio.to_thread.run_sync(call, contents)
        assert (info.value.code, info.value.status) == (code, status)
    with pytest.raises(errors.ClientError) as info:
        await trio.to_thread.run_sync(call, "hi", "wrong-key")
    assert info.value.code == 400 and "API key not valid" in str(info.value.message)
    # The retry delay is in the body, never in a Retry-After header.
    url = f"{sim.base_url}/v1beta/models/{MODEL}:generateContent"
    raw = body(contents=[{"parts": [{"text": scripted({"status": 429})}]}])
    r = await client.post(url, json=raw, headers={"x-goog-api-key": KEY})
    assert r.status_code == 429 and "retry-after" not in r.headers
    assert r.json()["error"]["details"] == [
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "4s"}
    ]
    r = await client.post(url, json=body())
    assert r.status_code == 403 and r.json()["error"]["status"] == "PERMISSION_DENIED"
    r = await client.post(url, params={"key": KEY}, json=body())
    assert r.status_code == 200


async def test_stream_frames_and_error_mid_stream(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start(start_sim)
    url = f"{sim.base_url}/v1beta/models/{MODEL}:streamGenerateContent"
    headers = {"x-goog-api-key": KEY}
    r = await client.post(url, params={"alt": "sse"}, json=body(), headers=headers)
    assert r.headers["content-type"] == "text/event-stream"
    frames = r.text.split("\r\n\r\n")
    assert frames[-1] == "" and all(f.startswith("data: {") for f in frames[:-1])
    assert "[DONE]" not in r.text
    last = json.loads(frames[-2].removeprefix("data: "))
    assert last["candidates"][0]["finishReason"] == "STOP"
    # Without alt=sse: one JSON array, streamed.
    r = await client.post(url, json=body(), headers=headers)
    assert r.json()[-1]["candidates"][0]["finishReason"] == "STOP"

    failing = scripted({"text": "one two"}, {"status": 503, "in_stream": True})
    seen: list[str] = []

    def run() -> None:
        sdk = studio(sim.base_url)
        for chunk in sdk.models.generate_content_stream(model=MODEL, contents=failing):
            seen.append(chunk.text or "")

    with pytest.raises(errors.ServerError) as info:
        await trio.to_thread.run_sync(run)
    assert info.value.code == 503 and "".join(seen) == "one two"
    raw = body(contents=[{"parts": [{"text": failing}]}])
    r = await client.post(url, params={"alt": "sse"}, json=raw, headers=headers)
    assert r.status_code == 200
    assert r.text.endswith(
        'data: {"error":{"code":503,"message":"The model is overloaded. Please try again '
        'later.","status":"UNAVAILABLE"}}\r\n\r\n'
    )


async def test_client_leaving_mid_stream_aborts(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start(start_sim)
    content = scripted({"text": "first"}, {"delay_s": 60}, {"text": "never"})
    url = f"{sim.base_url}/v1beta/models/{MODEL}:streamGenerateContent"
    raw = body(contents=[{"parts": [{"text": content}]}])
    with trio.fail_after(DEADLINE_S):
        async with client.stream(
            "POST", url, params={"alt": "sse"}, json=raw, headers={"x-goog-api-key": KEY}
        ) as r:
            async for line in r.aiter_lines():
                if "first" in line:
                    break
        stats = await sim.engine.wait_until(lambda s: s.aborts == 1 and s.running == 0)
    assert stats.disconnects == 1


# ---- Vertex AI, with tokens from the simulator's POST /token --------------------------------


def _key_pair() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


def vertex(base_url: str, private_pem: str) -> genai.Client:
    info = {
        "type": "service_account",
        "client_email": "sim@project.iam.gserviceaccount.com",
        "private_key": private_pem,
        "private_key_id": "k1",
        "token_uri": base_url + "/token",
        "project_id": "project",
    }
    credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
        info, scopes=["https://www.googleapis.com/auth/cloud-platform"]
    )
    options = types.HttpOptions(
        base_url=base_url,
        api_version="v1",
        timeout=DEADLINE_S * 1000,
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    return genai.Client(
        vertexai=True,
        project="project",
        location="us-central1",
        credentials=credentials,
        http_options=options,
    )


async def test_vertex_sdk_with_service_account_tokens(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    private, public = _key_pair()
    # 60 s is inside google-auth's refresh margin: every call refreshes, which is what a test
    # of the refresh path wants to see.
    sim = await start(
        start_sim, vertex_require_token=True, oauth_public_key_pem=public, oauth_token_lifetime_s=60
    )

    def run() -> tuple[str | None, list[str]]:
        sdk = vertex(sim.base_url, private)
        whole = sdk.models.generate_content(model=MODEL, contents=scripted({"text": "Hi 🌍"}))
        chunks = sdk.models.generate_content_stream(model=MODEL, contents=scripted(*STEPS[:2]))
        return whole.text, [c.text or "" for c in chunks]

    text, streamed = await trio.to_thread.run_sync(run)
    assert text == "Hi 🌍" and "".join(streamed) == "Hello 世界 🌍"
    stats = sim.engine.stats()
    assert stats.token_grants == 2
    assert all(h["authorization"] == "<redacted>" for h in stats.last_request_headers)
    url = (
        f"{sim.base_url}/v1/projects/p/locations/l/publishers/google/models/{MODEL}:generateContent"
    )
    r = await client.post(url, json=body(), headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
    r = await client.post(url, json=body(), headers={"authorization": "Bearer sim-token-1"})
    assert r.status_code == 200


async def test_token_endpoint_refuses_bad_grants(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    private, _ = _key_pair()
    _, other_public = _key_pair()
    sim = await start(start_sim, oauth_public_key_pem=other_public)

    sdk = vertex(sim.base_url, private)

    def run() -> None:
        sdk.models.generate_content(model=MODEL, contents="hi")

    from google.auth.exceptions import RefreshError

    with pytest.raises(RefreshError, match="Invalid JWT Signature"):
        await trio.to_thread.run_sync(run)
    r = await client.post(sim.base_url + "/token", data={"grant_type": "password"})
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
    assert sim.engine.stats().token_grants == 0


async def test_vertex_accepts_the_api_key_as_bearer_by_default(
    start_sim: StartSim, client: httpx.AsyncClient
) -> None:
    sim = await start(start_sim)
    url = (
        f"{sim.base_url}/v1/projects/p/locations/l/publishers/google/models/{MODEL}"
        ":streamGenerateContent"
    )
    ok = await client.post(
        url, params={"alt": "sse"}, json=body(), headers={"authorization": f"Bearer {KEY}"}
    )
    assert ok.status_code == 200 and ok.text.endswith("\r\n\r\n")
    missing = await client.post(url, params={"alt": "sse"}, json=body())
    assert missing.status_code == 401
    wrong_model = url.replace(MODEL, "gemini-0")
    r = await client.post(wrong_model, json=body(), headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
