"""One set of llhttp callbacks for every parser of a kind, forwarding to the one being fed.

httptools keeps, per parser, the callbacks it finds on its protocol object: given the parser's
own state object, that was a bound method each (six to nine, some 0.9 KiB a parser with the
parser itself, two parsers for every open stream) and a reference cycle (state → parser →
bound method → state) that only the cyclic collector frees. Given this object instead, every
parser holds the same few callables, and the state object being fed is named in
:attr:`Forward.current` for the length of one ``feed_data`` call (synchronous: nothing else
runs meanwhile on this thread).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

Target = TypeVar("Target")

CALLBACKS = (
    "on_message_begin",
    "on_url",
    "on_status",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
)


class Forward(Generic[Target]):
    """The protocol object of every parser of a kind: each callback the target defines is an
    attribute here, made once, that calls the same method of :attr:`current`."""

    def __init__(self, target_type: type[Target]) -> None:
        self.current: Target | None = None
        for name in CALLBACKS:
            method = getattr(target_type, name, None)
            if method is not None:
                setattr(self, name, self._forwarder(method))

    def _forwarder(self, method: Any) -> Any:
        # The class's function, looked up once: a call is one more frame, no lookup.
        def forward(*args: bytes) -> None:
            method(self.current, *args)

        return forward
