"""Anthropic Messages: request translation and the stream and response parsers."""
