"""Tool-call assembly at its edges: which id and name win, the argument bound in bytes, order."""

from __future__ import annotations

import pytest

from trio_gateway.core.events import ToolCallDelta
from trio_gateway.core.toolcalls import ToolCallAssembler


def test_the_first_id_and_name_win() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=0, id="call-first", name="get_weather", arguments='{"a": '))
    asm.add(ToolCallDelta(index=0, id="call-second", name="get_time", arguments="1}"))
    [done] = asm.finish()
    assert (done.id, done.name) == ("call-first", "get_weather")
    assert done.arguments == {"a": 1}


def test_an_id_and_name_that_come_late_are_still_taken() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=0, id=None, name=None, arguments="{"))
    asm.add(ToolCallDelta(index=0, id="", name="", arguments=""))
    asm.add(ToolCallDelta(index=0, id="call-late", name="late", arguments="}"))
    [done] = asm.finish()
    assert (done.id, done.name, done.arguments) == ("call-late", "late", {})


def test_a_call_without_a_name_has_an_empty_name() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=0, id="c", name=None, arguments="{}"))
    assert asm.finish()[0].name == ""


def test_the_fallback_id_prefix_is_the_callers() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=3, id=None, name="f", arguments="{}"))
    assert asm.finish(fallback_id_prefix="toolu")[0].id == "toolu_3"


def test_calls_come_out_in_index_order_whatever_order_they_began_in() -> None:
    asm = ToolCallAssembler()
    for index in (2, 0, 1):
        asm.add(ToolCallDelta(index=index, id=f"c{index}", name=f"f{index}", arguments="{}"))
    assert [done.index for done in asm.finish()] == [0, 1, 2]
    assert [done.id for done in asm.finish()] == ["c0", "c1", "c2"]


def test_whitespace_only_arguments_are_an_empty_object_and_valid() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=0, id="c", name="f", arguments=" \n "))
    [done] = asm.finish()
    assert done.arguments == {}
    assert done.arguments_valid is True
    assert done.arguments_raw == " \n "


def test_valid_arguments_are_marked_valid() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=0, id="c", name="f", arguments="[1, 2]"))
    [done] = asm.finish()
    assert done.arguments == [1, 2]
    assert done.arguments_valid is True


def test_it_is_truthy_once_a_fragment_arrived() -> None:
    asm = ToolCallAssembler()
    assert not asm
    assert asm.finish() == []
    asm.add(ToolCallDelta(index=0, id="c", name="f", arguments=""))
    assert asm


def test_the_argument_bound_is_exact() -> None:
    asm = ToolCallAssembler(max_argument_bytes=8)
    asm.add(ToolCallDelta(index=0, id="c", name="f", arguments="1234"))
    asm.add(ToolCallDelta(index=0, id=None, name=None, arguments="5678"))  # 8: still allowed
    with pytest.raises(ValueError, match=r"^tool call 0 arguments exceed 8 bytes$"):
        asm.add(ToolCallDelta(index=0, id=None, name=None, arguments="9"))


def test_the_argument_bound_counts_utf8_bytes_not_characters() -> None:
    asm = ToolCallAssembler(max_argument_bytes=8)
    asm.add(ToolCallDelta(index=0, id="c", name="f", arguments="天気"))  # 2 characters, 6 bytes
    with pytest.raises(ValueError, match="exceed 8 bytes"):
        asm.add(ToolCallDelta(index=0, id=None, name=None, arguments="天"))  # 9 bytes


def test_each_call_has_its_own_argument_budget() -> None:
    asm = ToolCallAssembler(max_argument_bytes=4)
    asm.add(ToolCallDelta(index=0, id="a", name="f", arguments="1234"))
    asm.add(ToolCallDelta(index=1, id="b", name="g", arguments="5678"))
    assert [done.arguments for done in asm.finish()] == [1234, 5678]


def test_the_default_bound_is_one_mebibyte() -> None:
    asm = ToolCallAssembler()
    asm.add(ToolCallDelta(index=0, id="c", name="f", arguments='"' + "x" * ((1 << 20) - 2) + '"'))
    with pytest.raises(ValueError, match=f"exceed {1 << 20} bytes"):
        asm.add(ToolCallDelta(index=0, id=None, name=None, arguments=" "))
