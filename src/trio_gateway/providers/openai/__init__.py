"""OpenAI's own API: the OpenAI-compatible dialect with OpenAI's differences."""
