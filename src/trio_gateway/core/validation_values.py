"""The building blocks of ``validation.py``: the checks of single values, and their errors in
OpenAI's words (``Invalid type for 'messages[0].content': expected ...``). Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

from trio_gateway.core.errors import InvalidRequest

# Longest value quoted back in an error message: the message says what was wrong, it does not
# echo a megabyte of it.
QUOTE_CHARS: Final = 80

# A check reads one value at a path and raises if it is wrong.
Check: TypeAlias = Callable[[str, Any], object]

# --- errors in OpenAI's words ------------------------------------------------------------------
# JSON's types as OpenAI names them; bool before int, as a bool is an int to Python only.
KINDS: Final = (
    (type(None), "null"),
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a decimal"),
    (str, "a string"),
    (list, "an array"),
    (dict, "an object"),
)


def json_kind(value: object) -> str:
    return next((name for kind, name in KINDS if isinstance(value, kind)), type(value).__name__)


def quote(text: str) -> str:
    if len(text) > QUOTE_CHARS:
        text = text[:QUOTE_CHARS] + "..."
    return f"'{text}'"


def one_of(allowed: Sequence[str], last: str = "and") -> str:
    quoted = [f"'{value}'" for value in allowed]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} {last} {quoted[-1]}"


def wrong_type(path: str, expected: str, value: object) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid type for '{path}': expected {expected}, but got {json_kind(value)} instead.",
        param=path,
    )


def invalid(path: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid '{path}': {problem}", param=path)


def too_long(path: str, limit: int, length: int, noun: str = "string") -> InvalidRequest:
    a = "an" if noun[0] in "aeiou" else "a"
    return invalid(
        path,
        f"{noun} too long. Expected {a} {noun} with maximum length {limit}, "
        f"but got {a} {noun} with length {length} instead.",
    )


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# --- values ------------------------------------------------------------------------------------
def required(container: Mapping[str, Any], key: str, path: str) -> Any:
    """``container[key]``; absent is "missing", while a null stays for the type check to name."""
    if key not in container:
        missing = join(path, key)
        raise InvalidRequest(f"Missing required parameter: '{missing}'.", param=missing)
    return container[key]


def string(path: str, value: object) -> str:
    if not isinstance(value, str):
        raise wrong_type(path, "a string", value)
    return value


def boolean(path: str, value: object) -> None:
    if not isinstance(value, bool):
        raise wrong_type(path, "a boolean", value)


def json_object(path: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise wrong_type(path, "an object", value)
    return value


def array(
    path: str,
    value: object,
    *,
    min_items: int = 0,
    max_items: int | None = None,
    expected: str = "an array",
) -> list[Any]:
    if not isinstance(value, list):
        raise wrong_type(path, expected, value)
    if len(value) < min_items:  # only ever 1: "empty" is the whole story
        raise invalid(path, f"empty array. Expected an array with minimum length {min_items}.")
    if max_items is not None and len(value) > max_items:
        raise too_long(path, max_items, len(value), "array")
    return value


def enum_value(path: str, value: object, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise InvalidRequest(
            f"Invalid value: {quote(string(path, value))}. "
            f"Supported values are: {one_of(allowed)}.",
            param=path,
        )
    return string(path, value)


def in_range(path: str, value: float, low: float | None, high: float | None, kind: str) -> None:
    # Written as "not within" so that a NaN (never from the parser, but from a Python caller)
    # fails too.
    if low is not None and not value >= low:
        raise out_of_range(path, f"{kind} below minimum", f">= {low}", value)
    if high is not None and not value <= high:
        raise out_of_range(path, f"{kind} above maximum", f"<= {high}", value)


def out_of_range(path: str, problem: str, expected: str, value: float) -> InvalidRequest:
    return invalid(path, f"{problem} value. Expected a value {expected}, but got {value} instead.")


def number(kind: str, low: int | None = None, high: int | None = None) -> Check:
    """A decimal or an integer within bounds; a boolean is never a number (JSON's true is not
    1), and JSON's 2.0 is a decimal, not an integer, to OpenAI too."""
    types = int | float if kind == "decimal" else int

    def check(path: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, types):
            raise wrong_type(path, f"a {kind}" if kind == "decimal" else "an integer", value)
        in_range(path, value, low, high, kind)

    return check


def optional_fields(path: str, container: Mapping[str, Any], checks: Mapping[str, Check]) -> None:
    """Check each field that is present and not null; null means "not given", as at OpenAI."""
    for key, check in checks.items():
        value = container.get(key)
        if value is not None:
            check(join(path, key), value)
