"""What goes wrong on the HTTP/1.x wire."""

from __future__ import annotations


class H1Error(Exception):
    """The peer does not speak HTTP/1.x as this side requires; the message says where.

    On the server side ``status`` is the answer the client gets (400, 413, 431, 501, 505, or 408
    for a deadline); the client side maps every one to ``upstream_protocol_error``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def body_too_large(limit_name: str, limit_bytes: int, size_bytes: int | None = None) -> str:
    """A 413's message: the limit by the name its operator sets it under (the gateway's
    ``server.max_body_bytes``), and its value."""
    what = "request body" if size_bytes is None else f"request body of {size_bytes} bytes"
    return f"{what} is larger than {limit_name} ({limit_bytes} bytes)"
