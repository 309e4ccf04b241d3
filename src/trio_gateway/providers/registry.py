"""Which dialect speaks for a provider type from config."""

from __future__ import annotations

from trio_gateway.core.kind import RequestKind
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


# The provider types that serve each endpoint; chat is served by every type.
_OPENAI_WIRE = frozenset({"openai_compatible", "openai"})
ENDPOINT_TYPES: dict[RequestKind, frozenset[str]] = {
    RequestKind.COMPLETIONS: _OPENAI_WIRE,
    RequestKind.EMBEDDINGS: _OPENAI_WIRE,
}


def serves(provider_type: str, kind: RequestKind) -> bool:
    """Whether a provider of ``provider_type`` can be asked a request of ``kind`` at all (its
    model may still not serve it: that is the vendor's 404, ``unsupported_endpoint``)."""
    types = ENDPOINT_TYPES.get(kind)
    return types is None or provider_type in types
