"""trio-gateway: an LLM gateway for self-hosted vLLM next to cloud APIs."""

__version__ = "0.1.0"
