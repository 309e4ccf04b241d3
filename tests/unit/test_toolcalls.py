from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from trio_gateway.core.events import ToolCallDelta, ToolCallDone
from trio_gateway.core.toolcalls import ToolCallAssembler


def test_fragments_assemble_by_index_and_parse_only_at_finish() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=0, id="call-a", name="get_weather", arguments=""))
    asm.add(ToolCallDelta(index=1, id="call-b", name="get_time", arguments='{"tz": '))
    asm.add(ToolCallDelta(index=0, id=None, name=None, arguments='{"city": "Par'))
    asm.add(ToolCallDelta(index=0, id=None, name=None, arguments='is"}'))
    asm.add(ToolCallDelta(index=1, id=None, name=None, arguments='"UTC"}'))
    assert asm.finish() == [
        ToolCallDone(0, "call-a", "get_weather", {"city": "Paris"}, '{"city": "Paris"}', True),
        ToolCallDone(1, "call-b", "get_time", {"tz": "UTC"}, '{"tz": "UTC"}', True),
    ]


def test_invalid_arguments_are_handed_on_raw_and_marked() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=0, id="c", name="f", arguments='{"city": "Par'))
    [done] = asm.finish()
    assert done.arguments_valid is False
    assert done.arguments == '{"city": "Par'
    assert done.arguments_raw == '{"city": "Par'


def test_empty_arguments_are_an_empty_object() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=0, id="c", name="f", arguments=""))
    [done] = asm.finish()
    assert done.arguments == {} and done.arguments_valid


def test_missing_id_gets_a_stable_fallback() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=2, id=None, name="f", arguments="{}"))
    assert asm.finish()[0].id == "call_2"


@given(
    args=st.dictionaries(st.text(max_size=5), st.text(max_size=10), max_size=4),
    cuts=st.lists(st.integers(0, 200), max_size=10),
)
def test_any_fragmentation_gives_the_same_call(args: dict[str, str], cuts: list[int]) -> None:
    raw = json.dumps(args, ensure_ascii=False)
    asm = ToolCallAssembler()
    last = 0
    for i, cut in enumerate(sorted({c for c in cuts if c <= len(raw)})):
        asm.add(ToolCallDelta(0, "id" if i == 0 else None, "f" if i == 0 else None, raw[last:cut]))
        last = cut
    asm.add(ToolCallDelta(0, "id", "f", raw[last:]))
    [done] = asm.finish()
    assert done.arguments == args
    assert done.name == "f"
