"""Numbers in messages: ``1 key``, ``2 keys``."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1 (``plural`` when adding an s will
    not do)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
