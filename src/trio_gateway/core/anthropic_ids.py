"""Ids in Anthropic's shape: a prefix (``msg_``, ``toolu_``, ``req_``), ``01``, then 22 letters
and digits, as Anthropic's own (``msg_013Zva2CMHLNnXjNJJKqJ2EF``). Clients store and send them
back; some check the prefix. Pure but for the randomness."""

from __future__ import annotations

import secrets
from typing import Final

BASE62: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# 22 characters of 62: 131 random bits, more than a UUID's 122.
RANDOM_CHARS: Final = 22


def anthropic_id(prefix: str) -> str:
    return prefix + "01" + "".join(secrets.choice(BASE62) for _ in range(RANDOM_CHARS))
