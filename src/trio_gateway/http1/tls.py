"""The one trust setting of a provider's clients: which certificate authorities its TLS peers
(and a TLS-inspecting proxy) may be signed by.

Precedence, most specific first: the provider's ``ca_file`` (its certificates only: a private
CA, or the inspecting proxy's), then ``SSL_CERT_FILE``, then ``SSL_CERT_DIR`` (OpenSSL's and
httpx's variables), then certifi's bundle (httpx's default). The same context serves the chat
exchange (``client.py``) and every side request of the provider (httpx: vLLM's ``/load`` and
``/metrics``, Vertex AI's token exchange), so none of them trusts what another refuses.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import certifi


def trust_context(ca_file: str | None, environ: Mapping[str, str]) -> ssl.SSLContext:
    """A client context that checks the peer's certificate and name against the trust above.
    Raises ``OSError``/``ssl.SSLError`` for a file that cannot be read as certificates."""
    if ca_file:
        context = ssl.create_default_context(cafile=ca_file)
    elif environ.get("SSL_CERT_FILE"):
        context = ssl.create_default_context(cafile=environ["SSL_CERT_FILE"])
    elif environ.get("SSL_CERT_DIR"):
        context = ssl.create_default_context(capath=environ["SSL_CERT_DIR"])
    else:
        context = ssl.create_default_context(cafile=certifi.where())
    context.set_alpn_protocols(["http/1.1"])
    return context
