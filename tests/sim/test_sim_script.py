from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_gateway.sim import SimConfig
from trio_gateway.sim.request import ChatRequest, parse_chat_request
from trio_gateway.sim.script import (
    Delay,
    Drop,
    Fault,
    Finish,
    Generation,
    Reasoning,
    ScriptError,
    SplitUtf8,
    Text,
    Token,
    ToolCall,
    ToolCalls,
    VendorFinish,
    extract_script,
    parse_script,
    plan_generation,
    split_arguments,
)

CONFIG = SimConfig()
TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]


def request(content: str = "hi", config: SimConfig = CONFIG, **fields: Any) -> ChatRequest:
    body = {"messages": [{"role": "user", "content": content}], **fields}
    parsed = parse_chat_request(json.dumps(body).encode(), config)
    assert isinstance(parsed, ChatRequest), parsed
    return parsed


def plan(steps: list[Any] | None = None, config: SimConfig = CONFIG, **fields: Any) -> Generation:
    content = "hi" if steps is None else f"<sim>{json.dumps({'steps': steps})}</sim>"
    return plan_generation(request(content, config, **fields), config)


def kinds(generation: Generation) -> str:
    letters = {"reasoning": "r", "content": "c", "tool_name": "N", "tool_args": "a", "hidden": "_"}
    return "".join(letters[t.kind] for t in generation.tokens)


def shown(generation: Generation, kind: str) -> str:
    return "".join(t.text for t in generation.tokens if t.kind == kind)


# ---- parsing ----


@pytest.mark.parametrize(
    ("steps", "parsed"),
    [
        ([{"reasoning": "hm"}], (Reasoning(text="hm"),)),
        ([{"reasoning_tokens": 3}], (Reasoning(tokens=3),)),
        ([{"text": "x"}, {"text_tokens": 2}], (Text(text="x"), Text(tokens=2))),
        (
            [{"tool_call": {"name": "f", "arguments": {"city": "Zürich"}}}],
            (ToolCall(name="f", arguments='{"city": "Zürich"}'),),
        ),
        (
            [{"tool_call": {"name": "f", "arguments": '{"bad'}}],
            (ToolCall(name="f", arguments='{"bad'),),
        ),
        (
            [{"status": 503, "body": {"x": 1}, "retry_after": 2, "times": 1}],
            (Fault(status=503, body={"x": 1}, retry_after=2.0, times=1),),
        ),
        ([{"delay_s": 0.5}, {"drop": True}], (Delay(seconds=0.5), Drop())),
        ([{"finish": "length"}, {"split_utf8": True}], (Finish(reason="length"), SplitUtf8())),
        ([{"vendor_finish": "SAFETY"}], (VendorFinish(reason="SAFETY"),)),
        (
            [{"tool_calls": [{"name": "f"}, {"name": "g", "arguments": "{}"}], "interleave": True}],
            (
                ToolCalls(
                    calls=(ToolCall(name="f", arguments="{}"), ToolCall(name="g", arguments="{}")),
                    interleave=True,
                ),
            ),
        ),
    ],
)
def test_parse_script_steps(steps: list[Any], parsed: tuple[Any, ...]) -> None:
    assert parse_script(json.dumps({"steps": steps})).steps == parsed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{nope", "not JSON"),
        ('{"steps": {}}', "a script is"),
        ('{"steps": [], "extra": 1}', "a script is"),
        ('{"steps": [1]}', "must be an object"),
        ('{"steps": [{"text": "a", "reasoning": "b"}]}', "exactly one of"),
        ('{"steps": [{"txt": "a"}]}', "exactly one of"),
        ('{"steps": [{"text": "a", "colour": 1}]}', "unknown keys"),
        ('{"steps": [{"text": 3}]}', "must be a string"),
        ('{"steps": [{"text_tokens": -1}]}', "must be an integer"),
        ('{"steps": [{"status": 99}]}', "must be an integer"),
        ('{"steps": [{"delay_s": "1"}]}', "must be a number"),
        ('{"steps": [{"drop": false}]}', "must be true"),
        ('{"steps": [{"finish": "eos"}]}', '"finish" must be'),
        ('{"steps": [{"vendor_finish": ""}]}', '"vendor_finish" must be a non-empty string'),
        ('{"steps": [{"tool_call": {"arguments": {}}}]}', "non-empty string"),
        ('{"steps": [{"text": "a"}, {"reasoning": "b"}]}', "must come before"),
        ('{"steps": [{"tool_calls": []}]}', "a list of 1 to 64 calls"),
        ('{"steps": [{"tool_calls": [{"name": "f"}], "interleave": 1}]}', "must be a boolean"),
        ('{"steps": [{"tool_calls": [{"name": ""}]}]}', r"tool_calls\[0\]\"\.name must be"),
        ('{"steps": [{"tool_calls": [{"name": "f"}]}, {"reasoning": "b"}]}', "must come before"),
    ],
)
def test_bad_scripts_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        parse_script(text)


def test_the_script_comes_from_the_last_user_message_only() -> None:
    script = '<sim>{"steps": [{"text": "x"}]}</sim>'
    user_first = [
        {"role": "user", "content": script},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "no script here"},
    ]
    assert extract_script(user_first) is None
    parts = [{"type": "text", "text": "a <sim>"}, {"type": "text", "text": '{"steps": []}</sim>'}]
    found = extract_script([{"role": "user", "content": parts}, {"role": "tool", "content": ""}])
    assert found is not None and found.steps == ()


def test_a_closing_tool_result_with_a_script_steers_the_next_answer() -> None:
    question: dict[str, Any] = {"role": "user", "content": '<sim>{"steps": [{"text": "q"}]}</sim>'}
    call: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
    done = '<sim>{"steps": [{"text": "done"}]}</sim>'
    scripted: dict[str, Any] = {"role": "tool", "content": "out: " + done}
    plain: dict[str, Any] = {"role": "tool", "content": "18C"}

    def text_of(messages: list[dict[str, Any]]) -> object:
        found = extract_script(messages)
        assert found is not None
        step: Any = found.steps[0]
        return step.text

    assert text_of([question, call, scripted]) == "done"
    assert text_of([question, call, scripted, plain]) == "done"
    # An earlier turn's scripted result does not steer a later turn: the question does.
    assert text_of([question, call, scripted, call, plain]) == "q"


# ---- planning ----


def test_default_answer_thinks_then_answers() -> None:
    generation = plan()
    # <think>, 8 thoughts, </think>, blank line, 16 words, EOS
    assert kinds(generation) == "_" + "r" * 8 + "_" + "c" * 17 + "_"
    assert shown(generation, "content").startswith("\n\n")
    assert generation.finish_reason == "stop"
    assert plan() == generation  # the same request always gets the same answer


def test_default_answer_without_thinking() -> None:
    generation = plan(chat_template_kwargs={"enable_thinking": False})
    assert kinds(generation) == "c" * 16 + "_"


def test_answers_differ_between_requests() -> None:
    assert plan_generation(request("a"), CONFIG) != plan_generation(request("b"), CONFIG)


def test_literal_script() -> None:
    generation = plan([{"reasoning": "let me think"}, {"text": "Hello 世界 🌍"}])
    assert shown(generation, "reasoning") == "let me think"
    assert shown(generation, "content") == "\n\nHello 世界 🌍"
    assert kinds(generation) == "_rrr_c" + "cccc" + "_"


def test_reasoning_steps_vanish_when_thinking_is_off() -> None:
    generation = plan(
        [{"reasoning": "secret"}, {"text": "Hi"}], chat_template_kwargs={"enable_thinking": False}
    )
    assert kinds(generation) == "c_"


def test_without_reasoning_parser_thinking_stays_in_content() -> None:
    generation = plan([{"reasoning": "hm"}, {"text": "Hi"}], SimConfig(reasoning_parser=False))
    assert shown(generation, "content") == "<think>hm</think>\n\nHi"
    assert "r" not in kinds(generation)


def test_max_tokens_cuts_with_length() -> None:
    generation = plan([{"text": "one two three four"}], max_tokens=2)
    assert shown(generation, "content") == "one two"
    assert generation.finish_reason == "length"
    # Exactly as many tokens as the words plus EOS still ends with stop.
    assert plan([{"text": "one two"}], max_tokens=3).finish_reason == "stop"
    assert plan([{"text": "one two"}], max_tokens=2).finish_reason == "length"


def test_ignore_eos_generates_exactly_max_tokens() -> None:
    generation = plan(max_tokens=2000, ignore_eos=True)
    assert len(generation.tokens) == 2000
    assert generation.finish_reason == "length"
    assert generation.tokens[-1].kind == "content"


def test_tool_calls_are_parsed_with_tools() -> None:
    steps = [
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"tool_call": {"name": "get_time", "arguments": {}}},
    ]
    generation = plan(steps, tools=TOOLS)
    assert generation.finish_reason == "tool_calls"
    assert generation.tool_calls == 2
    first = "".join(
        t.text for t in generation.tokens if t.kind == "tool_args" and t.tool_index == 0
    )
    assert json.loads(first) == {"city": "Paris"}
    assert [t.text for t in generation.tokens if t.kind == "tool_name"] == [
        "get_weather",
        "get_time",
    ]


TWO_CALLS: list[dict[str, Any]] = [
    {"name": "get_weather", "arguments": {"city": "Paris"}},
    {"name": "get_time", "arguments": {"tz": "CET"}},
]


def call_order(generation: Generation) -> list[int]:
    return [t.tool_index for t in generation.tokens if t.kind in ("tool_name", "tool_args")]


def test_interleaved_tool_calls_alternate_their_fragments() -> None:
    generation = plan([{"tool_calls": TWO_CALLS, "interleave": True}], tools=TOOLS)
    order = call_order(generation)
    # 0, 1, 0, 1 … while both have fragments left (the first call has one more).
    assert order == [0, 1] * 6 + [0]
    for index, call in enumerate(TWO_CALLS):
        mine = [t for t in generation.tokens if t.tool_index == index and t.kind != "hidden"]
        assert mine[0] == Token(kind="tool_name", text=call["name"], tool_index=index)
        assert json.loads("".join(t.text for t in mine[1:])) == call["arguments"]
    assert generation.tool_calls == 2 and generation.finish_reason == "tool_calls"
    # The same tokens as the calls one after the other: the same cost, another order.
    sequential = plan([{"tool_calls": TWO_CALLS}], tools=TOOLS)
    assert sorted(generation.tokens, key=repr) == sorted(sequential.tokens, key=repr)
    assert call_order(sequential) == sorted(call_order(sequential))
    assert sequential.tokens == plan([{"tool_call": c} for c in TWO_CALLS], tools=TOOLS).tokens


@pytest.mark.parametrize("dialect", ["anthropic", "gemini"])
def test_interleaving_is_sequential_where_the_wire_has_no_such_thing(dialect: str) -> None:
    config = SimConfig(dialect=dialect)
    generation = plan([{"tool_calls": TWO_CALLS, "interleave": True}], config, tools=TOOLS)
    assert call_order(generation) == sorted(call_order(generation))


def test_interleaving_numbers_calls_after_the_ones_before() -> None:
    steps: list[Any] = [{"tool_call": TWO_CALLS[0]}, {"tool_calls": TWO_CALLS, "interleave": True}]
    generation = plan(steps, tools=TOOLS)
    assert generation.tool_calls == 3
    assert call_order(generation)[:9] == [0] * 7 + [1, 2]


def test_parallel_tool_calls_false_generates_but_hides_later_calls() -> None:
    steps = [
        {"tool_call": {"name": "a", "arguments": {}}},
        {"tool_call": {"name": "b", "arguments": {}}},
    ]
    both = plan(steps, tools=TOOLS)
    first_only = plan(steps, tools=TOOLS, parallel_tool_calls=False)
    assert len(first_only.tokens) == len(both.tokens)  # the GPU pays for both
    assert [t.text for t in first_only.tokens if t.kind == "tool_name"] == ["a"]


def test_tool_calls_without_parsing_are_plain_content() -> None:
    generation = plan([{"tool_call": {"name": "f", "arguments": {"a": 1}}}])  # no tools given
    assert (
        shown(generation, "content")
        == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    )
    assert generation.finish_reason == "stop"


def test_raw_invalid_arguments_pass_through() -> None:
    generation = plan([{"tool_call": {"name": "f", "arguments": '{"city": "Par'}}], tools=TOOLS)
    assert shown(generation, "tool_args") == '{"city": "Par'


def test_faults_delays_drops() -> None:
    generation = plan(
        [
            {"text": "a b"},
            {"delay_s": 0.25},
            {"delay_s": 0.25},
            {"text": "c"},
            {"drop": True},
            {"text": "d"},
            {"split_utf8": True},
        ]
    )
    delays = [t.delay_s for t in generation.tokens]
    assert delays == [0.0, 0.0, 0.5, 0.0, 0.0]
    assert generation.drop_after == 3
    assert generation.split_utf8
    fault = plan([{"delay_s": 1}, {"status": 429, "retry_after": 3}])
    assert fault.fault == Fault(status=429, retry_after=3.0)
    assert fault.fault_delay_s == 1.0


def test_a_drop_past_the_end_does_nothing() -> None:
    assert plan([{"text": "a b c"}, {"drop": True}], max_tokens=2).drop_after is None


def test_finish_override() -> None:
    generation = plan([{"text": "a"}, {"finish": "length"}])
    assert (kinds(generation), generation.finish_reason) == ("c", "length")
    tool = plan([{"tool_call": {"name": "f"}}, {"finish": "stop"}], tools=TOOLS)
    assert tool.finish_reason == "stop"


@pytest.mark.parametrize(
    ("arguments", "pieces"),
    [
        ('{"city": "x"}', ('{"c', "ity", '": ', '"x"', "}")),
        ('"Zürich"', ('"Z', "ü", "ric", 'h"')),
        ('"東京"', ('"', "東", "京", '"')),
        ('"👍🏽"', ('"', "👍🏽", '"')),
    ],
)
def test_split_arguments(arguments: str, pieces: tuple[str, ...]) -> None:
    assert split_arguments(arguments) == pieces


@given(st.text())
def test_split_arguments_gives_the_text_back(arguments: str) -> None:
    pieces = split_arguments(arguments)
    assert "".join(pieces) == arguments
    assert all(pieces)
