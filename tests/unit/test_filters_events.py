"""Output filters on the event level (core/filters.StreamFilter), their config (strict: unknown
names, unbounded regexes), the router's input check and the usage record's column."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from trio_gateway.accounting.ledger import COLUMNS, connect, row
from trio_gateway.cli.usage import records
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import ConfigError
from trio_gateway.core.errors import ContentFiltered
from trio_gateway.core.events import (
    CompletionText,
    Event,
    ReasoningDelta,
    ReasoningDetail,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.filter_match import FilterSpec, RegexRefused, regex_reach
from trio_gateway.core.filters import OutputBlocked, StreamFilter, alias_filters, input_match
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.usage import UsageRecord
from trio_gateway.dispatch.router import Router

SECRETS = FilterSpec(name="secrets", patterns=("falcon", "机密"))
STOP = FilterSpec(name="stop", patterns=("halt",), action="block", applies_to=("content",))


def stream(*specs: FilterSpec) -> StreamFilter:
    filters = alias_filters(specs, ()).output
    assert filters is not None
    return StreamFilter(filters)


def test_response_started_waits_for_the_first_event_said() -> None:
    one = stream(SECRETS)
    assert one.events([ResponseStarted("p"), TextDelta("fal")]) == []
    out = one.events([TextDelta("con!")])
    assert out == [ResponseStarted("p"), TextDelta("***!")]
    assert [r.name for r in one.matched] == ["secrets"]


def test_held_text_is_said_when_its_field_ends_or_the_answer_does() -> None:
    one = stream(SECRETS)
    # The reasoning starts: the content cannot go on, so what it held goes first.
    assert one.events([ResponseStarted("p"), TextDelta("a fal"), ReasoningDelta("机")]) == [
        ResponseStarted("p"),
        TextDelta("a "),
        TextDelta("fal"),
    ]
    out = one.events([Usage(1, 2), ResponseDone("stop")])
    assert out == [Usage(1, 2), ReasoningDelta("机"), ResponseDone("stop")]


def test_tool_arguments_per_call_and_the_done_event_whole() -> None:
    one = stream(SECRETS)
    out = one.events(
        [
            ToolCallDelta(0, "c0", "f", '{"a": "fal'),
            ToolCallDelta(1, "c1", "g", '{"b": "fal'),
            ToolCallDelta(0, None, None, 'con"}'),
        ]
    )
    # Each call's held text goes before the next one starts (a Messages client has one block at
    # a time); a call that goes on after another keeps matching: the rest of the word is masked.
    assert out == [
        ToolCallDelta(0, "c0", "f", '{"a": "'),
        ToolCallDelta(0, None, None, "fal"),
        ToolCallDelta(1, "c1", "g", '{"b": "'),
        ToolCallDelta(1, None, None, "fal"),
        ToolCallDelta(0, None, None, '***"}'),
    ]
    done = one.events([ToolCallDone(0, "c0", "f", {"a": "falcon"}, '{"a": "falcon"}', True)])
    assert done == [ToolCallDone(0, "c0", "f", {"a": "fal***"}, '{"a": "fal***"}', True)]
    # A call whose arguments came whole only.
    whole = one.events([ToolCallDone(2, "c2", "h", {"x": "机密"}, '{"x": "机密"}', True)])
    assert whole == [ToolCallDone(2, "c2", "h", {"x": "***"}, '{"x": "***"}', True)]
    # The other call said what it held when the first went on.
    cut_short = ToolCallDone(1, "c1", "g", '{"b": "fal', '{"b": "fal', False)
    assert one.events([cut_short]) == [cut_short]


def test_a_reasoning_detail_is_masked_whole() -> None:
    one = stream(SECRETS)
    detail = ReasoningDetail(0, "anthropic", text="the falcon", signature="sig")
    assert one.events([detail]) == [
        ReasoningDetail(0, "anthropic", text="the ***", signature="sig")
    ]


def test_completion_choices_are_fields_of_their_own() -> None:
    one = stream(SECRETS)
    out = one.events([CompletionText(0, "fal"), CompletionText(1, "con"), CompletionText(0, "c")])
    # The n waits: an accent may follow (ñ).
    assert out == [CompletionText(1, "co")]
    out = one.events([CompletionText(0, "on", "stop")])
    assert out == [CompletionText(0, "***", "stop")]


def test_block_says_what_came_before_and_nothing_of_the_match() -> None:
    one = stream(SECRETS, STOP)
    assert one.events([ResponseStarted("p"), TextDelta("ok ")]) == [
        ResponseStarted("p"),
        TextDelta("ok "),
    ]
    with pytest.raises(OutputBlocked) as blocked:
        one.events([TextDelta("falcon ha"), TextDelta("lt and more")])
    assert blocked.value.rule.name == "stop"
    assert blocked.value.events == [TextDelta("*** ")]
    assert blocked.value.provider == "p"


def test_block_before_anything_was_said_says_nothing() -> None:
    one = stream(STOP)
    # halt + U+030C would be halť, another word: decided by what follows.
    assert one.events([ResponseStarted("p"), TextDelta("halt")]) == []
    with pytest.raises(OutputBlocked) as blocked:
        one.events([TextDelta(" now")])
    assert blocked.value.events == []


def test_a_field_not_in_applies_to_passes_untouched() -> None:
    one = stream(STOP)
    events: list[Event] = [
        ResponseStarted("p"),
        ReasoningDelta("halt"),
        ToolCallDelta(0, "c", "f", "halt"),
    ]
    assert one.events(events) == events


def test_input_match_reads_every_text_of_a_request() -> None:
    matcher = alias_filters((), (SECRETS,)).input
    assert matcher is not None
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a FALCON"}]}]}
    calls = {
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "f", "arguments": '{"x": "机密"}'}}],
            }
        ]
    }
    assert input_match(matcher, parts) is not None
    assert input_match(matcher, calls) is not None
    assert input_match(matcher, {"prompt": ["ok", "falcon"]}) is not None
    assert input_match(matcher, {"messages": [{"role": "user", "content": "fal con"}]}) is None


@pytest.mark.parametrize(
    ("regex", "why"),
    [
        (r"\d+", "unbounded"),
        (r"a.*b", "unbounded"),
        (r"(ab){2,}", "unbounded"),
        (r"x?", "empty string"),
        (r"(", "not a valid regex"),
        (r"a{300}", "over 256"),
    ],
)
def test_regexes_without_a_bounded_match_are_refused(regex: str, why: str) -> None:
    with pytest.raises(RegexRefused, match=why):
        regex_reach(regex, case_sensitive=False)


def test_regex_reach_counts_anchors() -> None:
    assert regex_reach(r"\d{3}", case_sensitive=True) == (3, 1)
    assert regex_reach(r"\b\d{3}\b", case_sensitive=True) == (5, 3)
    assert regex_reach(r"^ab$", case_sensitive=True) == (4, 3)
    assert regex_reach(r"\pL{2}\z", case_sensitive=True) == (3, 2)


BASE = """
[aliases.a]
providers = [{name = "p", type = "openai_compatible", base_url = "http://h:1/v1", model = "m"}]
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        parse_config(text)
    return refused.value.problems


def test_config_names_every_filter_problem() -> None:
    text = BASE.replace('model = "m"}]', 'model = "m"}]\noutput_filters = ["nope", "ok", "ok"]')
    text += """
[filters.ok]
patterns = ["x"]
[filters.bad]
regex = ['\\d+']
applies_to = []
[filters.none]
action = "block"
[filters.empty]
patterns = [""]
"""
    assert problems(text) == [
        "filters.bad.regex[0]: '\\\\d+': its longest match is unbounded (a *, + or {n,} "
        "repeat): bound it, e.g. {1,64}",
        "filters.bad.applies_to: name at least one field",
        "filters.none: give patterns or regex (or both)",
        "filters.empty.patterns[0]: an empty pattern matches everywhere",
        "aliases.a.output_filters[0]: unknown filter 'nope' (defined with [filters.NAME]: "
        "bad, empty, none, ok)",
        "aliases.a.output_filters[2]: filter 'ok' is listed twice",
    ]


def test_config_structure_is_strict() -> None:
    text = (
        BASE + '[filters.f]\npatterns = ["x"]\naction = "drop"\napplies_to = ["text"]\nmsk = ""\n'
    )
    assert problems(text) == [
        "filters.f.action: unknown action 'drop' (known: mask, block)",
        "filters.f.applies_to: unknown field 'text' (known: content, reasoning, tool_arguments)",
        "filters.f: unknown key 'msk' (did you mean 'mask'?)",
    ]


async def test_router_refuses_a_request_its_input_filters_match() -> None:
    text = BASE.replace('model = "m"}]', 'model = "m"}]\ninput_filters = ["f"]')
    config = parse_config(text + '[filters.f]\npatterns = ["falcon"]\n')
    router = Router(config.aliases, {}, filters=config.filters)
    request = ChatRequest(
        alias="a",
        body={"messages": [{"role": "user", "content": "FALCON"}]},
        stream=False,
        include_usage=False,
        reasoning=None,
        required=frozenset(),
    )
    with pytest.raises(ContentFiltered) as refused:
        router.plan(request)
    assert refused.value.code == "content_filtered"
    assert refused.value.status == 400
    assert refused.value.filter_name == "f"
    # A reload whose alias names no filter leaves it none.
    plain = parse_config(BASE)
    router.apply(plain.aliases, {}, {}, plain.filters)
    assert router.filters == {}


def test_an_older_ledger_gains_the_filtered_column(tmp_path: Path) -> None:
    path = str(tmp_path / "old.sqlite3")
    old = sqlite3.connect(path)
    columns = ", ".join(c for c in COLUMNS if c != "filtered")
    old.execute(f"CREATE TABLE usage (id INTEGER PRIMARY KEY, {columns})")
    old.execute(
        "INSERT INTO usage (request_id, outcome, prompt_tokens, completion_tokens,"
        " reasoning_tokens, cached_tokens, estimated, duration_s, started_at)"
        " VALUES ('r0', 'completed', 0, 0, 0, 0, 0, 0, 0)"
    )
    old.commit()
    old.close()
    readonly = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert [r["filtered"] for r in records(readonly, None)] == [None]
    readonly.close()
    ledger = connect(path)
    assert list(ledger.execute("SELECT request_id, filtered FROM usage")) == [("r0", None)]
    record = UsageRecord(
        request_id="r",
        key=None,
        alias="a",
        provider="p",
        outcome="completed",
        started_at=0.0,
        filtered="secrets:mask",
    )
    assert dict(zip(COLUMNS, row(record), strict=True))["filtered"] == "secrets:mask"
