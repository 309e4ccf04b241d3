"""The simulated Gemini's thought signatures: opaque to clients, recognised when they come back.

Google's are encrypted blobs only the model that issued them can read; it refuses one it did not
issue or that was altered ("Corrupted thought signature."), and a value that is not base64 at all
fails the proto-JSON parse of the ``bytes`` field. The simulator's are ``nonce || HMAC(key,
nonce)`` under a key each simulator makes at start, so a signature from another simulator (the
vendor's other route, another model) is foreign here, as it is at Google. Pure: the key and the
nonce are given.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from typing import Final

__all__ = ["PLACEHOLDERS", "decode", "issued", "new_key", "sign"]

# Google's documented dummies for history it did not sign ("context_engineering_is_the_way_to_go"
# or "skip_thought_signature_validator", https://ai.google.dev/gemini-api/docs/thought-signatures
# #faqs): accepted as if signed.
PLACEHOLDERS: Final = frozenset(
    {"skip_thought_signature_validator", "context_engineering_is_the_way_to_go"}
)
NONCE_BYTES: Final = 16
KEY_BYTES: Final = 32
_BASE64: Final = re.compile(r"[A-Za-z0-9+/_-]*={0,2}")


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def _tag(key: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, nonce, hashlib.sha256).digest()


def sign(key: bytes, seed: str) -> str:
    """A signature, base64 like Google's; `seed` (unique per signed part) makes its nonce."""
    nonce = hashlib.sha256(seed.encode()).digest()[:NONCE_BYTES]
    return base64.b64encode(nonce + _tag(key, nonce)).decode()


def decode(value: str) -> bytes | None:
    """The bytes of a proto3 JSON ``bytes`` value: standard or URL-safe base64, padding
    optional; None when it is not base64 (Google's TYPE_BYTES parse error)."""
    if not _BASE64.fullmatch(value) or len(value.rstrip("=")) % 4 == 1:
        return None
    text = value.rstrip("=").replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except binascii.Error:
        return None


def issued(key: bytes, raw: bytes) -> bool:
    """Whether `raw` (a decoded signature) is one this key signed, unchanged."""
    nonce, tag = raw[:NONCE_BYTES], raw[NONCE_BYTES:]
    return len(nonce) == NONCE_BYTES and hmac.compare_digest(tag, _tag(key, nonce))
