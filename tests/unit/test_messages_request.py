"""The Messages front's request side (``messages_request``): an Anthropic body → the chat body
the gateway validates as any other, Anthropic's refusals in its words, Claude Code's session."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.events import ReasoningDetail
from trio_gateway.core.reasoning_details import ANTHROPIC, GOOGLE
from trio_gateway.core.request import validate_chat_body
from trio_gateway.fronts.messages.events import encode_signature
from trio_gateway.fronts.messages.request import session_of, translate


def body(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
    } | fields


def chat(**fields: Any) -> dict[str, Any]:
    translated = translate(body(**fields))
    validate_chat_body(translated.body)  # every translation is a valid chat body
    return translated.body


def test_the_minimal_body() -> None:
    assert chat() == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100,
    }


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        ("be brief", "be brief"),
        ([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}], "a"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "a\n\nb"),
    ],
)
def test_system_as_a_string_or_blocks(system: Any, expected: str) -> None:
    assert chat(system=system)["messages"][0] == {"role": "system", "content": expected}


def test_tool_results_come_first_as_tool_messages_and_images_follow() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and then?"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "x"}, image],
                },
            ],
        },
    ]
    out = chat(messages=messages)["messages"]
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "user"]
    assert out[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ],
    }
    assert out[2] == {"role": "tool", "tool_call_id": "t1", "content": "x"}
    assert out[3]["content"] == [
        {"type": "text", "text": "and then?"},
        {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
    ]


def test_an_error_result_says_so() -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "boom"}
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    assert chat(messages=messages)["messages"][2]["content"] == "Error: boom"


def test_a_base64_image_is_a_data_url() -> None:
    source = {"type": "base64", "media_type": "image/png", "data": "AAAA"}
    content = [{"type": "image", "source": source}, {"type": "text", "text": "what?"}]
    (message,) = chat(messages=[{"role": "user", "content": content}])["messages"]
    assert message["content"][0] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AAAA"},
    }


def test_thinking_blocks_become_reasoning_details() -> None:
    google = ReasoningDetail(0, GOOGLE, data="sig-g", tool_call_id="t1")
    content = [
        {"type": "thinking", "thinking": "hmm", "signature": "sig-a"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "thinking", "thinking": "qwen", "signature": ""},  # unsigned: nothing to return
        {"type": "thinking", "thinking": "", "signature": encode_signature(google)},
        {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
    ]
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1"}]},
    ]
    assistant = chat(messages=messages)["messages"][1]
    assert assistant["content"] == "ok"
    assert assistant["reasoning_details"] == [
        {
            "type": "reasoning.text",
            "text": "hmm",
            "signature": "sig-a",
            "format": ANTHROPIC,
            "index": 0,
        },
        {"type": "reasoning.encrypted", "data": "opaque", "format": ANTHROPIC, "index": 1},
        {"type": "reasoning.encrypted", "data": "sig-g", "id": "t1", "format": GOOGLE, "index": 0},
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    out = chat(tools=tools, tool_choice=choice | {"disable_parallel_tool_use": True})
    assert out["tool_choice"] == expected
    assert out["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert out.get("parallel_tool_calls") is (None if choice["type"] == "none" else False)


def test_server_tools_are_dropped_and_named() -> None:
    tools = [{"type": "web_search_20250305", "name": "web_search"}]
    translated = translate(body(tools=tools, tool_choice={"type": "any"}))
    assert "tools" not in translated.body and "tool_choice" not in translated.body
    assert translated.dropped == (
        ("server_tool", "web_search_20250305"),
        ("tool_choice", "tool_choice"),
    )
    assert translated.dropped_tools == ("web_search_20250305",)


def test_server_tools_named_by_known_type_or_other_and_refused_where_the_alias_says() -> None:
    tools = [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "x" * 500, "name": "x"},
        {"name": "f", "input_schema": {"type": "object"}},
    ]
    translated = translate(body(tools=tools))
    assert translated.dropped_tools == ("bash_20250124", "other")
    assert [t["function"]["name"] for t in translated.body["tools"]] == ["f"]
    with pytest.raises(UnsupportedParameter, match="'bash_20250124' server tools") as refused:
        translate(body(tools=tools), builtin_tools="refuse")
    assert refused.value.param == "tools.0.type"


@pytest.mark.parametrize(
    ("fields", "reasoning", "effort"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, True, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8000}}, True, "medium"),
        ({"thinking": {"type": "enabled", "budget_tokens": 16000}}, True, "high"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 60000}, "max_tokens": 64000},
            True,
            "xhigh",
        ),
        ({"thinking": {"type": "disabled"}}, False, None),
        ({"thinking": {"type": "adaptive", "display": "omitted"}}, True, None),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, True, "high"),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, True, "xhigh"),
        ({"output_config": {"effort": "low"}}, None, "low"),
        ({}, None, None),
    ],
)
def test_thinking_and_effort(
    fields: dict[str, Any], reasoning: bool | None, effort: str | None
) -> None:
    out = chat(**({"max_tokens": 64000} | fields))
    assert out.get("reasoning") is reasoning
    assert out.get("reasoning_effort") == effort
    # Shown only when the request enabled it, whatever the provider is asked.
    shown = fields.get("thinking", {}).get("type") in ("enabled", "adaptive")
    assert translate(body(**({"max_tokens": 64000} | fields))).thinking is shown


@pytest.mark.parametrize(
    ("fields", "reasoning", "effort"),
    [
        ({}, False, None),
        # Anthropic's effort without thinking is not thinking's: not sent as a reasoning effort.
        ({"output_config": {"effort": "high"}}, False, None),
        # What the request says itself stands.
        ({"thinking": {"type": "adaptive"}}, True, None),
        ({"thinking": {"type": "disabled"}}, False, None),
    ],
)
def test_an_alias_without_thinking_off_turns_unasked_thinking_off(
    fields: dict[str, Any], reasoning: bool, effort: str | None
) -> None:
    out = translate(body(**fields), without_thinking="off").body
    assert out.get("reasoning") is reasoning
    assert out.get("reasoning_effort") == effort
    validate_chat_body(out)  # no contradiction between the two fields


def test_sampling_stops_metadata_format_and_stream() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    out = chat(
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END", "STOP"],
        metadata={"user_id": "user_abc_account__session_1234-abcd"},
        output_config={"format": {"type": "json_schema", "schema": schema}},
        stream=True,
    )
    assert (out["temperature"], out["top_p"], out["top_k"]) == (0.5, 0.9, 40)
    assert out["stop"] == ["END", "STOP"] and out["stream"] is True
    assert out["user"] == "user_abc_account__session_1234-abcd"
    assert out["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }


@pytest.mark.parametrize(
    ("user_id", "session"),
    [
        ('{"device_id":"d","account_uuid":"","session_id":"s-1"}', "s-1"),
        ("user_abc_account_9f_session_5c1f-0f4e", "5c1f-0f4e"),
        ('{"device_id":"d"}', None),
        ("{not json", None),
        ("plain-user", None),
    ],
)
def test_the_session_in_a_claude_code_user_id(user_id: str, session: str | None) -> None:
    assert session_of(user_id) == session
    assert translate(body(metadata={"user_id": user_id})).session_id == session


def test_unknown_fields_are_dropped_with_bounded_labels() -> None:
    fields = {"context_management": {"edits": []}, "container": "c", "some_future_field": 1}
    translated = translate(body(**fields))
    assert "context_management" not in translated.body and "container" not in translated.body
    # Kept for Anthropic (not counted as dropped); the others dropped.
    assert translated.body["anthropic_extras"] == {"context_management": {"edits": []}}
    assert translated.dropped == (("container", "container"), ("other", "some_future_field"))
    # One of a shape Anthropic does not have is dropped as any other.
    assert translate(body(context_management=[])).dropped == (
        ("context_management", "context_management"),
    )


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"max_tokens": "8"}, "max_tokens: Input should be a valid integer"),
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({"messages": []}, "messages: at least one message is required"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "system", "content": "x"}]}, "at least one message is required"),
        ({"messages": [{"role": "user"}]}, "messages.0.content: Field required"),
        (
            {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
            "messages.0.content.0.type",
        ),
        ({"temperature": 1.5}, "temperature: Input should be between 0 and 1"),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2000}}, "max_tokens: must be greater"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name: Field required"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
        ({"model": ""}, "model: Field required"),
    ],
)
def test_refusals_in_anthropics_words(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        translate(body(**fields))
    assert says in refused.value.message


def test_max_tokens_is_required_except_to_count() -> None:
    without = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(InvalidRequest, match="max_tokens: Field required"):
        translate(without)
    assert "max_tokens" not in translate(without, count_only=True).body


def test_a_broken_gateway_signature_and_a_files_api_image_are_refused() -> None:
    bad = {"type": "thinking", "thinking": "", "signature": "tgw1.!!!"}
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": [bad]}]
    with pytest.raises(InvalidRequest, match="signature"):
        translate(body(messages=messages))
    image = {"type": "image", "source": {"type": "file", "file_id": "f"}}
    with pytest.raises(UnsupportedParameter):
        translate(body(messages=[{"role": "user", "content": [image]}]))


def test_a_system_message_in_the_list_stays_in_its_place() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
    ]
    assert chat(system="top", messages=messages)["messages"] == [
        {"role": "system", "content": "top"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "# Environment"},
    ]


def test_the_request_names_its_front_session_and_counts_what_it_dropped() -> None:
    from types import SimpleNamespace

    from trio_gateway.fronts.messages.route import messages_request
    from trio_gateway.ops.metrics import Metrics

    metrics = Metrics(lambda: [])
    router: Any = SimpleNamespace(aliases={"m": None}, metrics=metrics)
    user_id = json.dumps({"device_id": "d", "session_id": "s-42"})
    raw = json.dumps(body(metadata={"user_id": user_id}, container={}, x_new=1))
    request, thinking = messages_request(router, raw.encode(), None)
    assert not thinking
    assert (request.front, request.session_id, request.alias) == ("messages", "s-42", "m")
    counted = {
        field: metrics.registry.get_sample_value(
            "gateway_front_dropped_fields_total", {"front": "messages", "field": field}
        )
        for field in ("container", "other")
    }
    assert counted == {"container": 1.0, "other": 1.0}
