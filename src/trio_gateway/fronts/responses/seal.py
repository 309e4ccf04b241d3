"""The Responses front's ``encrypted_content``: a reasoning item's signed thinking, sealed.

With ``store: false`` (Codex's way) the gateway keeps nothing between turns, yet Anthropic
wants its signed thinking blocks back and Gemini its thought signatures. The answer's
``reasoning_details`` (``core/reasoning_details.py``) travel with the client as a reasoning
item's ``encrypted_content``, sealed with a server key: Fernet (``cryptography``: AES-128-CBC
with an HMAC-SHA256 over it), so the client can neither read the thinking nor forge a
signature the vendor would then trust. The gateway opens it when the item comes back.

The key is ``[responses] seal_key_env`` (a Fernet key in the environment, shared by every
worker and replica), else one made per process at start: a turn that reaches another process,
or comes after a restart, then loses its signed thinking (the item is dropped, counted, and
the vendor thinks afresh). Sealed text starts with :data:`PREFIX`, so the gateway tells its own
from another server's (OpenAI's encrypted reasoning, say), which it drops the same way.
"""

from __future__ import annotations

import json
from typing import Any, Final

from cryptography.fernet import Fernet, InvalidToken

PREFIX: Final = "tgw1."


class Sealer:
    """Seals and opens the reasoning details of an answer."""

    def __init__(self, key: bytes | None = None) -> None:
        self._fernet = Fernet(key if key is not None else Fernet.generate_key())

    def seal(self, details: list[dict[str, Any]]) -> str:
        payload = json.dumps(details, ensure_ascii=False, separators=(",", ":")).encode()
        return PREFIX + self._fernet.encrypt(payload).decode("ascii")

    def open(self, sealed: str) -> list[dict[str, Any]] | None:
        """The details sealed in ``sealed``; None when it is not the gateway's, or was sealed
        under another key, or was changed."""
        if not sealed.startswith(PREFIX):
            return None
        try:
            payload = self._fernet.decrypt(sealed[len(PREFIX) :].encode("ascii"))
        except (InvalidToken, UnicodeEncodeError, ValueError):
            return None
        details = json.loads(payload)
        if not isinstance(details, list) or not all(isinstance(d, dict) for d in details):
            return None
        return details


def valid_key(key: str) -> bool:
    """Whether ``key`` is a Fernet key (32 bytes, URL-safe base64), for the config's checks."""
    try:
        Fernet(key.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        return False
    return True
