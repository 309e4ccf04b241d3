"""Which generated mutant function holds a line of a mutated file: pure, and tested in
``make test`` (mutmut itself is installed for ``make mutation`` only).

mutmut 3 writes every mutant of a function as a function of its own, named ``x_<name>__mutmut_<n>``
(``xǁ<class>ǁ<name>__mutmut_<n>`` for a method), next to the original; mypy reports an error by
file and line, and the function whose lines hold it is the mutant the error kills.
"""

from __future__ import annotations

import ast
import bisect

# (function name, first line, last line): 1-based and inclusive, decorators included.
Span = tuple[str, int, int]


def is_mutant_name(name: str) -> bool:
    """mutmut 3.8's rule for its generated functions."""
    return name.startswith(("x_", "xǁ")) and "__mutmut" in name


def mutated_functions(source: str) -> list[Span]:
    """The generated mutant functions of a mutated file, in line order.

    The walk does not enter functions (mutmut's own libcst visitor does not either): a mutant is
    never nested in another function, and a nested function named like one is not a mutant.
    """
    found: list[Span] = []
    pending: list[ast.AST] = [ast.parse(source)]
    while pending:
        node = pending.pop()
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                pending.append(child)
            elif is_mutant_name(child.name):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                last = child.end_lineno if child.end_lineno is not None else child.lineno
                found.append((child.name, first, last))
    found.sort(key=lambda span: span[1])
    return found


def function_at(spans: list[Span], line: int) -> Span | None:
    """The span holding ``line``, if any, in spans sorted by their first line (they do not
    overlap: functions are not nested)."""
    i = bisect.bisect_right(spans, line, key=lambda span: span[1]) - 1
    if i >= 0 and line <= spans[i][2]:
        return spans[i]
    return None
