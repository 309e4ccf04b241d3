"""The parts of ``make mutation``'s tooling that decide what a mutant counts as.

``tools/mutation/type_map.py`` maps mypy's errors to mutants instead of mutmut's libcst pass
(minutes per run): a wrong span would kill the wrong mutant or none, so the shapes mutmut writes
are here. ``fast_first.Selection`` decides which tests of a mutant's files are built at all: one
left out that was asked for would let a mutant survive.
"""

from __future__ import annotations

import textwrap

from tools.mutation.fast_first import Selection
from tools.mutation.type_map import function_at, is_mutant_name, mutated_functions

MUTATED = textwrap.dedent(
    """\
    import functools

    def x_plain__mutmut_orig(a):
        return a

    def x_plain__mutmut_1(a):
        def x_inner__mutmut_9():
            return None
        return None

    class Box:
        def xǁBoxǁget__mutmut_1(self):
            return 1

        @functools.cache
        def xǁBoxǁget__mutmut_2(
            self,
        ):
            return 2

    if True:
        async def x_later__mutmut_3():
            pass

    def helper():
        return 0
    """
)


def test_spans_of_functions_methods_and_blocks_in_line_order() -> None:
    assert mutated_functions(MUTATED) == [
        ("x_plain__mutmut_orig", 3, 4),
        ("x_plain__mutmut_1", 6, 9),
        ("xǁBoxǁget__mutmut_1", 12, 13),
        # The decorator's line belongs to the function.
        ("xǁBoxǁget__mutmut_2", 15, 19),
        ("x_later__mutmut_3", 22, 23),
    ]


def test_a_line_maps_to_the_function_that_holds_it_or_to_none() -> None:
    spans = mutated_functions(MUTATED)
    assert function_at(spans, 3) == ("x_plain__mutmut_orig", 3, 4)
    assert function_at(spans, 4) == ("x_plain__mutmut_orig", 3, 4)
    # A nested function's line is its enclosing mutant's.
    assert function_at(spans, 8) == ("x_plain__mutmut_1", 6, 9)
    assert function_at(spans, 17) == ("xǁBoxǁget__mutmut_2", 15, 19)
    assert function_at(spans, 23) == ("x_later__mutmut_3", 22, 23)
    for outside in (1, 2, 5, 10, 11, 14, 20, 21, 25, 26, 99):
        assert function_at(spans, outside) is None, outside
    assert function_at([], 1) is None


def test_mutmut_names() -> None:
    assert is_mutant_name("x_f__mutmut_1")
    assert is_mutant_name("xǁCǁm__mutmut_12")
    assert not is_mutant_name("x_f")
    assert not is_mutant_name("f__mutmut_1")


def test_selection_builds_what_was_asked_for_and_its_parents() -> None:
    selection = Selection(
        [
            "tests/unit/test_a.py::test_one",
            "tests/unit/test_a.py::test_param[x-1]",
            "tests/unit/test_b.py::TestBox::test_get[a::b]",
            "tests/e2e/test_whole.py",
            "tests/unit/test_c.py::TestWhole",
        ]
    )
    module_a = "tests/unit/test_a.py"
    assert selection.wanted(module_a, "test_one")
    # Every parametrization of a function asked for once (pytest then picks the id).
    assert selection.wanted(module_a, "test_param")
    assert not selection.wanted(module_a, "test_two")
    assert not selection.wanted(module_a, "test_on")
    # A class on the way to a method asked for, and the method in it.
    assert selection.wanted("tests/unit/test_b.py", "TestBox")
    assert selection.wanted("tests/unit/test_b.py::TestBox", "test_get")
    assert not selection.wanted("tests/unit/test_b.py::TestBox", "test_put")
    assert not selection.wanted("tests/unit/test_b.py", "test_get")
    # A file asked for whole keeps everything in it.
    assert selection.wanted("tests/e2e/test_whole.py", "test_anything")
    assert not selection.wanted("tests/e2e/test_other.py", "test_anything")
    assert selection.wanted("tests/unit/test_c.py", "TestWhole")
    assert selection.wanted("tests/unit/test_c.py::TestWhole", "test_anything")
    assert not selection.wanted("tests/unit/test_c.py", "TestOther")
