"""Providers: one pure dialect module per vendor behind one I/O shell (``upstream.py``).

A new vendor is one dialect module (``dialect.py`` says what it provides) and one line in
:func:`dialect_for`.
"""

from __future__ import annotations

from trio_gateway.providers.anthropic import AnthropicDialect
from trio_gateway.providers.dialect import Dialect
from trio_gateway.providers.gemini import GeminiDialect, VertexDialect
from trio_gateway.providers.openai import OpenAIDialect
from trio_gateway.providers.openai_compatible import OpenAICompatibleDialect


def dialect_for(provider_type: str) -> Dialect:
    """The dialect of a provider ``type`` from config (config has already checked the name)."""
    dialects: dict[str, Dialect] = {
        "openai_compatible": OpenAICompatibleDialect(),
        "openai": OpenAIDialect(),
        "anthropic": AnthropicDialect(),
        "gemini": GeminiDialect(),
        "vertex": VertexDialect(),
    }
    return dialects[provider_type]
