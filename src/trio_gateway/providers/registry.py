"""Which dialect speaks for a provider type from config."""

from __future__ import annotations

from trio_gateway.providers.anthropic.dialect import AnthropicDialect
from trio_gateway.providers.dialect import Dialect
from trio_gateway.providers.gemini.dialect import GeminiDialect, VertexDialect
from trio_gateway.providers.openai.dialect import OpenAIDialect
from trio_gateway.providers.openai_compatible.dialect import OpenAICompatibleDialect


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
