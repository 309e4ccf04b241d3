"""``fronts/responses/request.py``: Responses bodies → chat bodies, table by table."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.request import validate_chat_body
from trio_gateway.fronts.responses.request import flat_name, parse_responses_body
from trio_gateway.fronts.responses.seal import Sealer

SEALER = Sealer()


def parse(body: dict[str, Any], **kwargs: Any) -> Any:
    return parse_responses_body({"model": "m", **body}, opener=SEALER.open, **kwargs)


def messages(body: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
    parsed = parse(body, **kwargs)
    # Every translation is a chat body the gateway's own validation takes.
    validate_chat_body(parsed.chat)
    result: list[dict[str, Any]] = parsed.chat["messages"]
    return result


def test_a_string_input_and_instructions() -> None:
    assert messages({"input": "hi", "instructions": "be brief"}) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


def test_message_items_of_every_role() -> None:
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "s"}]},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"},
            ],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "a picture"}]},
        {"role": "user", "content": "thanks"},
    ]
    assert messages({"input": items}) == [
        {"role": "system", "content": "rules"},
        {"role": "system", "content": "s"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
            ],
        },
        {"role": "assistant", "content": "a picture"},
        {"role": "user", "content": "thanks"},
    ]


def test_a_turn_of_reasoning_text_and_calls_is_one_assistant_message() -> None:
    details = [{"type": "reasoning.text", "text": "t", "signature": "s", "format": "f", "index": 0}]
    items = [
        {"role": "user", "content": "go"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "encrypted_content": SEALER.seal(details),
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "two"}],
        },
    ]
    tools = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in "fg"]
    assert messages({"input": items, "tools": tools}) == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
            "reasoning_details": details,
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]


def test_reasoning_sealed_elsewhere_is_dropped_and_counted() -> None:
    other = Sealer().seal([{"type": "reasoning.encrypted", "data": "d", "format": "f"}])
    items = [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "summary": [], "encrypted_content": other},
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-openai-s-own"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    parsed = parse({"input": items, "tools": [{"type": "function", "name": "f"}]})
    assert "reasoning_details" not in parsed.chat["messages"][1]
    assert parsed.dropped_fields.count("reasoning_unopened") == 2


def test_settings_map_to_chat_fields() -> None:
    parsed = parse(
        {
            "input": "x",
            "tools": [{"type": "function", "name": "f", "description": "d", "strict": True}],
            "tool_choice": {"type": "function", "name": "f"},
            "parallel_tool_calls": False,
            "reasoning": {"effort": "high", "summary": "auto"},
            "max_output_tokens": 99,
            "temperature": 0.5,
            "top_p": 0.9,
            "stream": True,
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
            "prompt_cache_key": "conv-1",
        }
    )
    chat = parsed.chat
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": "d",
                "parameters": {"type": "object", "properties": {}},
                "strict": True,
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["reasoning_effort"] == "high" and parsed.summary
    assert chat["max_completion_tokens"] == 99
    assert (chat["temperature"], chat["top_p"]) == (0.5, 0.9)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": {"type": "object"}},
    }
    assert parsed.session == "conv-1" and chat["prompt_cache_key"] == "conv-1"
    assert parsed.store is True
    validate_chat_body(chat)


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"type": "json_object"}),
    ],
)
def test_text_formats(fmt: dict[str, Any], expected: Any) -> None:
    assert parse({"input": "x", "text": {"format": fmt}}).chat.get("response_format") == expected


def test_namespace_tools_are_flattened_and_named_back() -> None:
    tools = [
        {
            "type": "namespace",
            "name": "mcp__github__",
            "description": "GitHub",
            "tools": [
                {"type": "function", "name": "get_issue", "parameters": {"type": "object"}},
                {"type": "custom", "name": "free"},
            ],
        },
        {
            "type": "namespace",
            "name": "files",
            "description": "",
            "tools": [{"type": "function", "name": "read"}],
        },
    ]
    items = [
        {"role": "user", "content": "x"},
        {
            "type": "function_call",
            "call_id": "c",
            "namespace": "files",
            "name": "read",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "c", "output": "y"},
    ]
    parsed = parse({"input": items, "tools": tools})
    names = [t["function"]["name"] for t in parsed.chat["tools"]]
    assert names == ["mcp__github__get_issue", "files__read"]
    assert parsed.tool_names == {
        "mcp__github__get_issue": ("mcp__github__", "get_issue"),
        "files__read": ("files", "read"),
    }
    assert parsed.chat["messages"][1]["tool_calls"][0]["function"]["name"] == "files__read"
    assert parsed.dropped_tools == ("custom",)


@given(st.text(min_size=1, max_size=100), st.text(min_size=1, max_size=100))
def test_a_flat_name_is_always_a_valid_function_name(namespace: str, name: str) -> None:
    flat = flat_name(namespace, name)
    assert 1 <= len(flat) <= 64
    assert all(c.isascii() and (c.isalnum() or c in "_-") for c in flat)


def test_builtin_tools_are_dropped_or_refused() -> None:
    tools = [{"type": "web_search"}, {"type": "function", "name": "f"}]
    parsed = parse({"input": "x", "tools": tools})
    assert parsed.dropped_tools == ("web_search",)
    # A type the API does not have is "other": a client's string never reaches a header.
    odd = parse({"input": "x", "tools": [{"type": "evil\r\nx-injected: 1"}]})
    assert odd.dropped_tools == ("other",)
    assert [t["function"]["name"] for t in parsed.chat["tools"]] == ["f"]
    assert parsed.echo["tools"] == [{"type": "function", "name": "f"}]
    with pytest.raises(UnsupportedParameter) as refused:
        parse({"input": "x", "tools": tools}, builtin_tools="refuse")
    assert refused.value.param == "tools[0].type"


def test_only_builtin_tools_leave_no_tools_and_no_tool_settings() -> None:
    parsed = parse(
        {
            "input": "x",
            "tools": [{"type": "web_search"}],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        }
    )
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & parsed.chat.keys()
    validate_chat_body(parsed.chat)


def test_unknown_fields_are_dropped_by_name_or_as_other() -> None:
    parsed = parse(
        {
            "input": "x",
            "include": ["reasoning.encrypted_content", "message.output_text.logprobs"],
            "client_metadata": {"a": "b"},
            "brand_new_field": 1,
            "store": False,
            "text": {"verbosity": "low"},
        }
    )
    assert sorted(parsed.dropped_fields) == [
        "client_metadata",
        "include",
        "other",
        "text.verbosity",
    ]
    assert parsed.store is False


@pytest.mark.parametrize(
    ("body", "error", "param"),
    [
        ({"conversation": "conv_1"}, UnsupportedParameter, "conversation"),
        ({"background": True}, UnsupportedParameter, "background"),
        ({"input": [{"type": "item_reference", "id": "rs_x"}]}, InvalidRequest, "input"),
        ({"input": [{"id": "rs_x"}]}, InvalidRequest, "input"),
        ({"input": [{"type": 5}]}, InvalidRequest, "input[0].type"),
        ({"input": ["hello"]}, InvalidRequest, "input[0]"),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
            InvalidRequest,
            "input[0].arguments",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
            InvalidRequest,
            "input[0].arguments",
        ),
        ({"input": "x", "max_output_tokens": 15}, InvalidRequest, "max_output_tokens"),
        ({"input": "x", "store": "no"}, InvalidRequest, "store"),
        ({"input": "x", "stream": "yes"}, InvalidRequest, "stream"),
        ({"input": "x", "metadata": [1]}, InvalidRequest, "metadata"),
        ({"input": "x", "metadata": {"k": "v" * 513}}, InvalidRequest, "metadata.k"),
        ({"input": "x", "reasoning": {"summary": 1}}, InvalidRequest, "reasoning.summary"),
        ({"input": "x", "include": "all"}, InvalidRequest, "include"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "u", "detail": "max"}],
                    }
                ]
            },
            InvalidRequest,
            "input[0].content[0].detail",
        ),
        ({"input": 3}, InvalidRequest, "input"),
        ({"input": [{"role": "wizard", "content": "x"}]}, InvalidRequest, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            UnsupportedParameter,
            "input[0].content[0].image_url",
        ),
        (
            {"input": [{"type": "function_call_output", "output": "x"}]},
            InvalidRequest,
            "input[0].call_id",
        ),
        ({"input": "x", "reasoning": {"effort": "maximal"}}, InvalidRequest, "reasoning.effort"),
        (
            {"input": "x", "tool_choice": {"type": "web_search"}},
            UnsupportedParameter,
            "tool_choice.type",
        ),
        ({}, InvalidRequest, "input"),
    ],
)
def test_refusals_name_their_param(
    body: dict[str, Any], error: type[Exception], param: str
) -> None:
    with pytest.raises(error) as refused:
        parse(body)
    assert getattr(refused.value, "param", None) == param


def test_include_asking_for_sealed_reasoning_is_served() -> None:
    asked = parse({"input": "x", "include": ["reasoning.encrypted_content"]})
    assert asked.sealed_reasoning is True
    assert asked.dropped_fields == ()
    assert parse({"input": "x"}).sealed_reasoning is False
    # A vLLM model's reasoning, sealed because the client asked: accepted back, carried nowhere
    # (no vendor takes it back), and not counted as dropped.
    turn = parse(
        {
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "reasoning", "summary": [], "encrypted_content": SEALER.seal([])},
                {"type": "message", "role": "assistant", "content": "hello"},
                {"role": "user", "content": "again"},
            ]
        }
    )
    assert turn.chat["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    assert turn.dropped_fields == ()


def test_history_comes_before_the_input() -> None:
    history = [
        {"type": "message", "role": "user", "content": "first"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
    ]
    assert messages({"input": "second", "instructions": "i"}, history=history) == [
        {"role": "system", "content": "i"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "second"},
    ]


def test_the_seal_keeps_what_it_seals_and_refuses_what_it_did_not() -> None:
    details = [{"type": "reasoning.text", "text": "秘密", "signature": "sig"}]
    sealed = SEALER.seal(details)
    assert "秘密" not in sealed and "sig" not in sealed
    assert SEALER.open(sealed) == details
    tampered = sealed[:-5] + ("A" if sealed[-5] != "A" else "B") + sealed[-4:]
    assert SEALER.open(tampered) is None
    assert Sealer().open(sealed) is None
    assert SEALER.open("not ours") is None


def test_the_input_s_items_are_kept_as_the_gateway_used_them() -> None:
    details = [{"type": "reasoning.text", "text": "t", "signature": "s", "format": "f", "index": 0}]
    sealed = SEALER.seal(details)
    items: list[Any] = [
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {}},
        {"role": "user", "content": "go", "id": "msg_client"},
        {"type": "reasoning", "summary": [], "encrypted_content": sealed, "id": "rs_1"},
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-not-ours"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plain"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "status": "x"},
        {
            "type": "function_call_output",
            "call_id": "c",
            "output": [
                {"type": "input_text", "text": "18C"},
                {"type": "input_image", "image_url": "data:image/png;base64," + "A" * 1000},
            ],
        },
    ]
    parsed = parse({"input": items, "tools": [{"type": "function", "name": "f"}]})
    assert parsed.input_items == [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "reasoning", "summary": [], "encrypted_content": sealed},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "18C"},
    ]
    # Kept items read back as the same conversation.
    again = parse({"input": parsed.input_items, "tools": [{"type": "function", "name": "f"}]})
    assert again.chat["messages"] == parsed.chat["messages"]


def test_a_reference_reads_as_the_item_it_names() -> None:
    base = "ab" * 16
    stored: dict[str, Any] = {
        f"rs_{base}_0": {"id": f"rs_{base}_0", "type": "reasoning", "summary": [], "content": []},
        f"msg_{base}_1": {
            "id": f"msg_{base}_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "one", "annotations": []}],
        },
    }
    items: list[Any] = [
        {"role": "user", "content": "q"},
        {"type": "item_reference", "id": f"rs_{base}_0"},
        {"id": f"msg_{base}_1"},
        {"role": "user", "content": "again"},
    ]
    parsed = parse({"input": items}, referenced=stored)
    assert parsed.chat["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "again"},
    ]
    assert parsed.input_items[1] == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "one", "annotations": []}],
    }
    # A reference inside a referenced item is not followed.
    looped = {"x": {"type": "item_reference", "id": "x"}}
    with pytest.raises(InvalidRequest):
        parse({"input": [{"type": "item_reference", "id": "x"}]}, referenced=looped)


def test_a_chat_error_names_the_field_the_client_sent() -> None:
    parsed = parse(
        {
            "input": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}],
            "instructions": "i",
            "tools": [
                {"type": "web_search"},
                {"type": "function", "name": "ok"},
                {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}]},
            ],
        }
    )
    assert parsed.client_param("max_completion_tokens") == "max_output_tokens"
    assert parsed.client_param("response_format.json_schema.name") == "text.format.name"
    assert parsed.client_param("reasoning_effort") == "reasoning.effort"
    assert parsed.client_param("tools[0].function.name") == "tools[1].name"
    assert parsed.client_param("tools[1].function.parameters") == "tools[2].tools[0].parameters"
    assert parsed.client_param("messages[0].content") == "instructions.content"
    assert parsed.client_param("messages[2].content[0]") == "input[1].content[0]"
    assert parsed.client_param("messages[20]") == "input[20]"
    assert parsed.client_param("temperature") == "temperature"
