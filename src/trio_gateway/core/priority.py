"""A request's priority class: an integer, lower first, as vLLM's ``priority`` field.

Where it comes from, in order: the key's ``priority`` in the keys file; else its alias's
``priority`` (``[aliases.X] priority``, default 0). A client may then ask for a *lower*
priority (a larger number) with the ``x-priority`` header, or with vLLM's own ``priority``
field in the body (``extra_body={"priority": 5}`` in the OpenAI SDK); when both are given the
larger wins. Asking for a smaller number than one's own is refused (400 ``invalid_request``),
never quietly clamped: a client that believes it is served first, and is not, is worse off
than one told why.
"""

from __future__ import annotations

import re

from trio_gateway.core.errors import InvalidRequest

__all__ = ["PRIORITY_MAX", "PRIORITY_MIN", "PRIORITY_RANGE", "effective_priority"]

# A 32-bit range: vLLM takes any int64, but a rank (arrival + priority x aging seconds) must
# stay exact in a float, and no deployment needs four billion classes.
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
PRIORITY_RANGE = f"must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}"
_INTEGER = re.compile(r"[+-]?[0-9]{1,10}")


def _header_value(text: str) -> int:
    value = text.strip()
    if not _INTEGER.fullmatch(value) or not PRIORITY_MIN <= int(value) <= PRIORITY_MAX:
        raise InvalidRequest(f"x-priority {PRIORITY_RANGE}; got {value[:32]!r}", param="x-priority")
    return int(value)


def _body_value(value: object) -> int:
    if type(value) is not int or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        shown = repr(value)[:32]
        raise InvalidRequest(f"'priority' {PRIORITY_RANGE}; got {shown}", param="priority")
    return value


def effective_priority(
    own: int, whose: str, header: str | None = None, body_value: object = None
) -> int:
    """The priority a request runs at: ``own`` (the key's or alias's, named by ``whose`` in
    messages), or the larger number the client asked for. Raises ``InvalidRequest`` for a
    malformed value or one that would raise the request above ``own``."""
    asked: list[tuple[str, int]] = []
    if header is not None:
        asked.append(("x-priority", _header_value(header)))
    if body_value is not None:
        asked.append(("priority", _body_value(body_value)))
    for param, value in asked:
        if value < own:
            raise InvalidRequest(
                f"{param} {value} would put this request before its own priority {own} "
                f"({whose}): a request may only lower its priority, to a larger number",
                param=param,
            )
    return max([own, *(value for _, value in asked)])
