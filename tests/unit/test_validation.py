"""OpenAI's request rules at the front: each bad body names its exact ``param`` and says what is
allowed; every valid shape passes untouched, vLLM's extension fields included."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.request import validate_chat_body
from trio_gateway.core.validation import MAX_DEPTH, ROLES

USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "get_weather"}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


def chat(*messages: Any, **fields: Any) -> dict[str, Any]:
    return {"model": "agent-lite", "messages": list(messages) or [USER], **fields}


def user(*parts: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def image(url: Any = "https://example.com/cat.png", **fields: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **fields}}


def tool(name: Any = "get_weather", **function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **function}}


def nested(wraps: int) -> Any:
    """A JSON schema ``wraps`` objects around a string: two levels each (the object and its
    ``properties``), so ``2 * wraps + 1`` levels in all."""
    schema: Any = {"type": "string"}
    for _ in range(wraps):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


BAD: list[Any] = [
    # messages
    (chat(messages=None), "messages", "expected an array, but got null"),
    ({"model": "agent-lite"}, "messages", "Missing required parameter: 'messages'"),
    (chat(messages="hi"), "messages", "expected an array, but got a string"),
    (chat(messages=[]), "messages", "empty array"),
    (chat("hi"), "messages[0]", "expected an object, but got a string"),
    (chat({"content": "x"}), "messages[0].role", "Missing required parameter"),
    (
        chat({"role": "robot", "content": "x"}),
        "messages[0].role",
        "Invalid value: 'robot'. Supported values are: 'system', 'developer', 'user', "
        "'assistant', 'tool' and 'function'.",
    ),
    (chat({"role": 1, "content": "x"}), "messages[0].role", "expected a string"),
    (chat({"role": "user"}), "messages[0].content", "Missing required parameter"),
    (chat({"role": "user", "content": None}), "messages[0].content", "but got null"),
    (chat({"role": "user", "content": 5}), "messages[0].content", "string or array of objects"),
    (chat({"role": "user", "content": []}), "messages[0].content", "empty array"),
    (chat({"role": "user", "content": "x", "name": 7}), "messages[0].name", "expected a string"),
    (chat({"role": "system", "content": [image()]}), "messages[0].content[0].type", "'text'"),
    (chat({"role": "developer", "content": {}}), "messages[0].content", "string or array"),
    (chat(USER, user("hi")), "messages[1].content[0]", "expected an object"),
    (chat(user({"text": "x"})), "messages[0].content[0].type", "Missing required parameter"),
    (
        chat(user({"type": "video_url", "video_url": {"url": "x"}})),
        "messages[0].content[0].type",
        "Supported values are: 'text', 'image_url', 'input_audio' and 'file'.",
    ),
    (chat(user({"type": "refusal", "refusal": "no"})), "messages[0].content[0].type", "'file'"),
    (chat(user({"type": "text"})), "messages[0].content[0].text", "Missing required parameter"),
    (chat(user({"type": "text", "text": 3})), "messages[0].content[0].text", "got an integer"),
    (chat(user({"type": "image_url"})), "messages[0].content[0].image_url", "Missing required"),
    (
        chat(user({"type": "image_url", "image_url": "https://x/y.png"})),
        "messages[0].content[0].image_url",
        "expected an object, but got a string",
    ),
    (chat(user(image(None))), "messages[0].content[0].image_url.url", "but got null"),
    (chat(user(image("ftp://x/y.png"))), "messages[0].content[0].image_url.url", "http(s)"),
    (chat(user(image("cat.png"))), "messages[0].content[0].image_url.url", "'cat.png'"),
    (
        chat(user(image(detail="ultra"))),
        "messages[0].content[0].image_url.detail",
        "Invalid value: 'ultra'. Supported values are: 'auto', 'low', 'high' and 'original'.",
    ),
    (
        chat(user({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}})),
        "messages[0].content[0].input_audio.format",
        "'wav' and 'mp3'",
    ),
    (
        chat(user({"type": "input_audio", "input_audio": {"format": "wav"}})),
        "messages[0].content[0].input_audio.data",
        "Missing required parameter",
    ),
    (
        chat(user({"type": "file", "file": {"file_id": 12}})),
        "messages[0].content[0].file.file_id",
        "expected a string",
    ),
    (chat(user({"type": "file", "file": "f"})), "messages[0].content[0].file", "an object"),
    (chat({"role": "assistant"}), "messages[0].content", "unless it has 'tool_calls'"),
    (chat({"role": "assistant", "content": None}), "messages[0].content", "Missing required"),
    (
        chat({"role": "assistant", "content": [image()]}),
        "messages[0].content[0].type",
        "Supported values are: 'text' and 'refusal'.",
    ),
    (
        chat({"role": "assistant", "content": [{"type": "refusal", "refusal": None}]}),
        "messages[0].content[0].refusal",
        "but got null",
    ),
    (chat({"role": "assistant", "tool_calls": []}), "messages[0].tool_calls", "empty array"),
    (chat({"role": "assistant", "tool_calls": {}}), "messages[0].tool_calls", "an array"),
    (
        chat({"role": "assistant", "tool_calls": [{**CALL, "id": 1}]}),
        "messages[0].tool_calls[0].id",
        "expected a string",
    ),
    (
        chat({"role": "assistant", "tool_calls": [{**CALL, "type": "fn"}]}),
        "messages[0].tool_calls[0].type",
        "Invalid value: 'fn'. Supported values are: 'function' and 'custom'.",
    ),
    (
        chat({"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}),
        "messages[0].tool_calls[0].function",
        "Missing required parameter",
    ),
    (
        chat(
            {
                "role": "assistant",
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {"a": 1}}}],
            }
        ),
        "messages[0].tool_calls[0].function.arguments",
        "expected a string, but got an object",
    ),
    (
        chat({"role": "assistant", "function_call": {"name": "f"}}),
        "messages[0].function_call.arguments",
        "Missing required parameter",
    ),
    (chat({"role": "assistant", "refusal": 1}), "messages[0].refusal", "expected a string"),
    (chat({"role": "assistant", "audio": {}}), "messages[0].audio.id", "Missing required"),
    (chat({"role": "tool", "content": "sunny"}), "messages[0].tool_call_id", "Missing required"),
    (
        chat({"role": "tool", "tool_call_id": 3, "content": "sunny"}),
        "messages[0].tool_call_id",
        "expected a string",
    ),
    (chat({"role": "tool", "tool_call_id": "c"}), "messages[0].content", "Missing required"),
    (
        chat({"role": "tool", "tool_call_id": "c", "content": [image()]}),
        "messages[0].content[0].type",
        "Supported values are: 'text'.",
    ),
    (chat({"role": "function", "content": "x"}), "messages[0].name", "Missing required"),
    (
        chat({"role": "function", "name": "f", "content": ["x"]}),
        "messages[0].content",
        "expected a string",
    ),
    # tools
    (chat(tools={}), "tools", "expected an array, but got an object"),
    (chat(tools=[]), "tools", "empty array"),
    (chat(tools=[tool(f"f{i}") for i in range(129)]), "tools", "maximum length 128"),
    (chat(tools=["get_weather"]), "tools[0]", "expected an object"),
    (chat(tools=[{"function": {"name": "f"}}]), "tools[0].type", "Missing required parameter"),
    (chat(tools=[{**TOOL, "type": "retrieval"}]), "tools[0].type", "'function' and 'custom'"),
    (chat(tools=[{"type": "function"}]), "tools[0].function", "Missing required parameter"),
    (chat(tools=[tool(None)]), "tools[0].function.name", "expected a string, but got null"),
    (chat(tools=[tool("get weather")]), "tools[0].function.name", "^[a-zA-Z0-9_-]{1,64}$"),
    (chat(tools=[tool("")]), "tools[0].function.name", "does not match pattern"),
    (chat(tools=[tool("f" * 65)]), "tools[0].function.name", "maximum length 64"),
    (chat(tools=[tool(description=["x"])]), "tools[0].function.description", "a string"),
    (chat(tools=[tool(parameters="{}")]), "tools[0].function.parameters", "an object"),
    (chat(tools=[tool(strict="yes")]), "tools[0].function.strict", "a boolean"),
    (chat(tools=[TOOL, tool("other"), TOOL]), "tools[2].function.name", "duplicate"),
    # tool_choice, parallel_tool_calls
    (chat(tools=[TOOL], tool_choice="any"), "tool_choice", "'none', 'auto' and 'required'"),
    (chat(tools=[TOOL], tool_choice=1), "tool_choice", "string or an object"),
    (chat(tools=[TOOL], tool_choice={"type": "tool"}), "tool_choice.type", "'function'"),
    (chat(tools=[TOOL], tool_choice={"type": "function"}), "tool_choice.function", "Missing"),
    (
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
        "tool_choice.function.name",
        "no function named 'nope' in 'tools'. Defined functions are: 'get_weather'.",
    ),
    (chat(tool_choice="auto"), "tool_choice", "only allowed when 'tools' are specified"),
    (chat(tool_choice="required"), "tool_choice", "only allowed when 'tools'"),
    (
        chat(tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        "tool_choice",
        "'tool_choice' is only allowed when 'tools' are specified",
    ),
    (chat(parallel_tool_calls=False), "parallel_tool_calls", "only allowed when 'tools'"),
    (chat(tools=[TOOL], parallel_tool_calls=1), "parallel_tool_calls", "a boolean"),
    # numbers
    (chat(temperature=2.5), "temperature", "Expected a value <= 2, but got 2.5"),
    (chat(temperature=-0.1), "temperature", "decimal below minimum value"),
    (chat(temperature="0.7"), "temperature", "expected a decimal, but got a string"),
    (chat(temperature=True), "temperature", "expected a decimal, but got a boolean"),
    (chat(top_p=1.5), "top_p", "<= 1"),
    (chat(top_p=[1]), "top_p", "expected a decimal"),
    (chat(n=0), "n", "integer below minimum value"),
    (chat(n=1.0), "n", "expected an integer, but got a decimal"),
    (chat(n=True), "n", "expected an integer, but got a boolean"),
    (chat(max_tokens=0), "max_tokens", ">= 1"),
    (chat(max_tokens=1.5), "max_tokens", "expected an integer"),
    (chat(max_completion_tokens=-3), "max_completion_tokens", ">= 1"),
    (chat(presence_penalty=2.1), "presence_penalty", "<= 2"),
    (chat(frequency_penalty=-2.1), "frequency_penalty", ">= -2"),
    (chat(seed="42"), "seed", "expected an integer"),
    (chat(seed=2**64), "seed", "integer above maximum value"),
    (chat(top_logprobs=21), "top_logprobs", "<= 20"),
    (chat(top_logprobs=-1), "top_logprobs", ">= 0"),
    (chat(logprobs="yes"), "logprobs", "a boolean"),
    (chat(logit_bias=[1]), "logit_bias", "an object"),
    (chat(logit_bias={"hello": 5}), "logit_bias", "'hello' is not a token id"),
    (chat(logit_bias={"50256": 101}), "logit_bias.50256", "<= 100"),
    (chat(logit_bias={"50256": "-100"}), "logit_bias.50256", "expected a decimal"),
    # stop
    (chat(stop=7), "stop", "one of a string or array of strings"),
    (chat(stop=["a", "b", "c", "d", "e"]), "stop", "maximum length 4"),
    (chat(stop=["a", 3]), "stop[1]", "expected a string"),
    # response_format
    (chat(response_format="json"), "response_format", "an object"),
    (chat(response_format={}), "response_format.type", "Missing required parameter"),
    (
        chat(response_format={"type": "yaml"}),
        "response_format.type",
        "Supported values are: 'text', 'json_object' and 'json_schema'.",
    ),
    (
        chat(response_format={"type": "json_schema"}),
        "response_format.json_schema",
        "Missing required parameter",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
        "response_format.json_schema.name",
        "Missing required parameter",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "a.b"}}),
        "response_format.json_schema.name",
        "does not match pattern",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": 1}}),
        "response_format.json_schema.schema",
        "expected an object, but got an integer",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "strict": 1}}),
        "response_format.json_schema.strict",
        "a boolean",
    ),
    # stream
    (chat(stream="yes"), "stream", "expected a boolean, but got a string"),
    (chat(stream=1), "stream", "a boolean"),
    (chat(stream=True, stream_options=[]), "stream_options", "an object"),
    (
        chat(stream=True, stream_options={"include_usage": "true"}),
        "stream_options.include_usage",
        "a boolean",
    ),
    (
        chat(stream_options={"include_usage": True}),
        "stream_options",
        "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
    ),
    (chat(stream=False, stream_options={}), "stream_options", "only allowed when 'stream'"),
    # reasoning, the gateway's extension and OpenAI's effort
    (chat(reasoning_effort="max"), "reasoning_effort", "must be one of"),
    (chat(reasoning="on"), "reasoning", "true or false"),
    # the rest
    (chat(user=42), "user", "expected a string"),
    (chat(metadata=[]), "metadata", "an object"),
    (chat(metadata={"k": 1}), "metadata.k", "expected a string"),
    (chat(metadata={f"k{i}": "v" for i in range(17)}), "metadata", "at most 16 properties"),
    (chat(metadata={"k" * 65: "v"}), "metadata." + "k" * 65, "maximum length 64"),
    (chat(metadata={"k": "v" * 513}), "metadata.k", "maximum length 512"),
    (chat(store="no"), "store", "a boolean"),
    (chat(modalities="text"), "modalities", "an array"),
    (chat(modalities=["video"]), "modalities[0]", "'text' and 'audio'"),
    (chat(service_tier="turbo"), "service_tier", "Supported values are: 'auto'"),
    (chat(verbosity="loud"), "verbosity", "'low', 'medium' and 'high'"),
    (chat(prompt_cache_key=1), "prompt_cache_key", "a string"),
    # nesting
    # parameters is level 5 (body, tools, tools[0], function), so its 30th nested schema is
    # level 65: the first one past the limit.
    (
        chat(tools=[tool(parameters=nested(40))]),
        "tools[0].function.parameters" + ".properties.x" * 30,
        "nested too deeply",
    ),
    # Depth counts in fields the gateway does not know too: extra is level 2.
    (chat(extra=nested(40)), "extra" + ".properties.x" * 31 + ".properties", "at most 64"),
]


@pytest.mark.parametrize(("body", "param", "fragment"), BAD)
def test_bad_bodies_name_the_param_and_say_what_is_allowed(
    body: dict[str, Any], param: str, fragment: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_chat_body(body)
    error = info.value
    assert (error.param, error.status, error.code) == (param, 400, "invalid_request")
    assert error.openai_type == "invalid_request_error"
    assert fragment in error.message, error.message


def test_there_is_a_row_for_every_rule() -> None:
    assert len(BAD) >= 60
    assert len({param for _, param, _ in BAD}) >= 60


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(tools=[{"type": "custom", "custom": {"name": "grep"}}]), "tools[0].type"),
        (
            chat(
                tools=[TOOL],
                tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto"}},
            ),
            "tool_choice.type",
        ),
        (
            chat({"role": "assistant", "tool_calls": [{**CALL, "type": "custom"}]}),
            "messages[0].tool_calls[0].type",
        ),
        (chat(n=2), "n"),
        (chat(logprobs=True), "logprobs"),
        (chat(top_logprobs=3), "logprobs"),
    ],
)
def test_what_openai_accepts_and_the_gateway_cannot_carry_is_unsupported(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(UnsupportedParameter) as info:
        validate_chat_body(body)
    assert info.value.param == param


DATA_URL = "data:image/png;base64,iVBORw0KGgo="
GOOD: list[Any] = [
    chat({"role": "system", "content": "be brief"}, USER),
    chat({"role": "developer", "content": [{"type": "text", "text": "be brief"}]}, USER),
    chat({"role": "user", "content": "hi", "name": "ann"}),
    chat(
        user(
            {"type": "text", "text": "what is this?"},
            image(),
            image(DATA_URL, detail="low"),
            image("HTTP://EXAMPLE.COM/A.PNG", detail="auto"),
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            {"type": "file", "file": {"file_data": "JVBERi0=", "filename": "a.pdf"}},
            {"type": "file", "file": {"file_id": "file-abc"}},
        )
    ),
    chat(USER, {"role": "assistant", "content": "hello"}, USER),
    chat(USER, {"role": "assistant", "content": ""}, USER),
    chat(
        USER,
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "no"}],
        },
        USER,
    ),
    chat(USER, {"role": "assistant", "content": None, "refusal": "I can't"}, USER),
    chat(USER, {"role": "assistant", "content": None, "audio": {"id": "audio_1"}}, USER),
    chat(
        USER,
        {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": None},
    ),
    chat(
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "x"}]},
        tools=[TOOL],
    ),
    chat(
        tools=[
            tool(
                description="the weather",
                parameters={"type": "object", "properties": {"city": {"type": "string"}}},
                strict=True,
            ),
            tool("get-time_2"),
        ],
        tool_choice={"type": "function", "function": {"name": "get-time_2"}},
        parallel_tool_calls=False,
    ),
    chat(tools=[TOOL], tool_choice="required", parallel_tool_calls=True),
    chat(tool_choice="none"),
    chat(tool_choice=None, parallel_tool_calls=None, tools=None),
    chat(tools=[tool(parameters=nested((MAX_DEPTH - 6) // 2))]),  # 63 levels
    chat(extra=nested((MAX_DEPTH - 2) // 2)),  # 64 levels: the limit itself passes
    chat(response_format={"type": "text"}),
    chat(response_format={"type": "json_object"}),
    chat(
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "answer",
                "description": "an answer",
                "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                "strict": True,
            },
        }
    ),
    chat(
        temperature=0,
        top_p=1,
        n=1,
        max_tokens=1,
        max_completion_tokens=4096,
        presence_penalty=-2,
        frequency_penalty=2.0,
        seed=-1,
        top_logprobs=0,
        logprobs=False,
        logit_bias={"50256": -100, "13": 2.5},
        stop=None,
        user="u-1",
        metadata={"team": "search"},
        store=False,
        modalities=["text"],
        service_tier="auto",
        verbosity="low",
        reasoning_effort="low",
        reasoning=True,
    ),
    chat(temperature=None, top_p=None, max_tokens=None, stop="\n"),
    chat(stop=["a", "b", "c", "d"], stream=True, stream_options={"include_usage": True}),
    chat(stream=False, stream_options=None),
    # vLLM's extensions and fields unknown to the gateway pass, and stay in the body.
    chat(
        top_k=20,
        min_p=0.05,
        repetition_penalty=1.1,
        min_tokens=4,
        chat_template_kwargs={"enable_thinking": False},
        structured_outputs={"regex": "[a-z]+"},
        guided_json={"type": "object"},
        ignore_eos=True,
        some_future_field={"anything": [1, "two", None]},
    ),
]


@pytest.mark.parametrize("body", GOOD)
def test_valid_bodies_pass_untouched(body: dict[str, Any]) -> None:
    before = copy.deepcopy(body)
    request = validate_chat_body(body)
    assert request.body is body
    assert body == before


def test_vision_routing_reads_the_openai_image_part() -> None:
    assert Capability.VISION in validate_chat_body(chat(user(image(DATA_URL)))).required
    assert Capability.VISION not in validate_chat_body(chat()).required


def test_every_role_has_a_valid_example() -> None:
    roles = {message["role"] for body in GOOD for message in body["messages"]}
    assert roles == set(ROLES)


# --- arbitrary input -----------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "stream",
        "stream_options", "temperature", "top_p", "n", "max_tokens", "seed", "top_logprobs",
        "logit_bias", "stop", "user", "metadata", "store", "modalities", "service_tier",
        "reasoning", "reasoning_effort", "logprobs", "top_k",
    ]
)  # fmt: skip
KEYS = st.sampled_from(
    ["role", "content", "type", "text", "image_url", "url", "detail", "tool_calls", "id",
     "function", "name", "arguments", "tool_call_id", "input_audio", "data", "format", "file",
     "refusal", "audio", "json_schema", "schema", "strict", "parameters", "include_usage"]
)  # fmt: skip
# Values shaped like the real thing, so that the search gets past the first type check.
SHAPED = st.recursive(
    JSON | st.sampled_from([*ROLES, "function", "image_url", "text", "auto", "json_schema"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(KEYS | st.text(max_size=4), children, max_size=5)
    ),
    max_leaves=30,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES)}, optional={"content": SHAPED, "tool_calls": SHAPED}
)
VALID_MESSAGE = st.sampled_from([m for body in GOOD for m in body["messages"]])
BODY = st.dictionaries(FIELDS, SHAPED, max_size=6).flatmap(
    lambda fields: st.fixed_dictionaries(
        {
            "model": st.just("agent-lite"),
            "messages": st.lists(VALID_MESSAGE | MESSAGE | SHAPED, min_size=1, max_size=3),
        }
    ).map(lambda base: {**base, **fields})
)


@st.composite
def damaged(draw: st.DrawFn) -> dict[str, Any]:
    """A valid body with one value somewhere inside it replaced by anything: the search starts
    past the first checks, where the deep ones are."""
    body: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(GOOD)))
    node: Any = body
    while True:
        key = draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
        child = node[key]
        if isinstance(child, dict | list) and child and draw(st.booleans()):
            node = child
        else:
            node[key] = draw(SHAPED)
            return body


@settings(max_examples=300, deadline=None)
@given(body=damaged() | BODY | JSON)
def test_arbitrary_json_only_ever_raises_the_request_errors_and_never_mutates(body: Any) -> None:
    before = copy.deepcopy(body)
    with contextlib.suppress(InvalidRequest, UnsupportedParameter):
        validate_chat_body(body)
    assert body == before
