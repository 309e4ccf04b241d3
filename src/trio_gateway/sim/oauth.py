"""Pure check of a Google service-account token grant (RFC 7523 JWT bearer), as
`https://oauth2.googleapis.com/token` receives it from google-auth: a form body with
`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<RS256 JWT>`.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any
from urllib.parse import parse_qs

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

__all__ = ["GOOGLE_TOKEN_URL", "GRANT_TYPE", "MAX_LIFETIME_S", "check_grant"]

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_URL = "https://oauth2.googleapis.com/token"
MAX_LIFETIME_S = 3600  # Google refuses assertions valid for longer than an hour
CLOCK_SKEW_S = 300  # an `iat` this far in the future is still accepted
MAX_FORM_BYTES = 64 * 1024
_CLAIMS = ("iss", "scope", "aud", "iat", "exp")
_MINUTES = MAX_LIFETIME_S // 60


def _b64(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def _json_segment(segment: str) -> Any:
    return json.loads(_b64(segment))


def check_grant(
    form: bytes, *, token_url: str, now: float, public_key_pem: str | None
) -> str | None:
    """None when the grant is good, else the `error_description` of Google's invalid_grant."""
    if len(form) > MAX_FORM_BYTES:
        return "Request too large"
    try:
        fields = parse_qs(form.decode("ascii"), strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        return "Invalid form body"
    if fields.get("grant_type") != [GRANT_TYPE]:
        return "Invalid grant_type"
    assertion = fields.get("assertion", [""])[0]
    segments = assertion.split(".")
    if len(segments) != 3:
        return "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe"
    try:
        header = _json_segment(segments[0])
        claims = _json_segment(segments[1])
        signature = _b64(segments[2])
    except (ValueError, binascii.Error):
        return "Invalid JWT: malformed segments"
    if not isinstance(header, dict) or header.get("alg") != "RS256":
        return "Invalid JWT: unsupported signing algorithm, expected RS256"
    if not isinstance(claims, dict) or any(name not in claims for name in _CLAIMS):
        return "Invalid JWT: missing claims " + ", ".join(n for n in _CLAIMS if n not in claims)
    # google-auth always names Google's endpoint as the audience, whatever token_uri it
    # posts to; a client that names the URL it really posts to is right too.
    if claims["aud"] not in (token_url, GOOGLE_TOKEN_URL):
        return f"Invalid JWT audience: {claims['aud']!r}, expected {token_url!r}"
    iat, exp = claims["iat"], claims["exp"]
    if not isinstance(iat, int | float) or not isinstance(exp, int | float):
        return "Invalid JWT: iat and exp must be numbers"
    if exp - iat > MAX_LIFETIME_S or exp <= iat:
        return f"Invalid JWT: Token must be a short-lived token ({_MINUTES} minutes)"
    if exp <= now or iat > now + CLOCK_SKEW_S:
        return (
            "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe. "
            "Check your iat and exp values"
        )
    if public_key_pem is not None:
        key = serialization.load_pem_public_key(public_key_pem.encode())
        if not isinstance(key, rsa.RSAPublicKey):
            return "Invalid JWT Signature."
        signed = f"{segments[0]}.{segments[1]}".encode()
        try:
            key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            return "Invalid JWT Signature."
    return None
