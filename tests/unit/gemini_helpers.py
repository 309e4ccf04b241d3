"""Shared by the gemini and vertex dialects' unit tests: the providers and request parts they
send, ``body_for`` (a request body for some fields), and ``check_with_sdk``, which judges a
body by Google's own SDK: its pydantic models (``google.genai.types``) forbid unknown fields,
so a misspelt or invented name fails there as it would at Google."""

from __future__ import annotations

from typing import Any

import google.genai.types as gtypes

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.request import validate_chat_body
from trio_gateway.providers.gemini.request import (
    build_body,
)

GEMINI = ProviderConfig(
    name="gem",
    type="gemini",
    model="gemini-2.5-flash",
    api_key_env="GEMINI_KEY",
    capabilities=frozenset({Capability.REASONING, Capability.TOOLS, Capability.VISION}),
)
VERTEX = ProviderConfig(
    name="vtx",
    type="vertex",
    model="gemini-2.5-pro",
    credentials_file="/etc/sa.json",
    project="my-project",
    location="europe-west4",
    capabilities=frozenset({Capability.REASONING}),
)
PLAIN = ProviderConfig(name="old", type="gemini", model="gemini-2.0-flash", api_key_env="K")
USER = {"role": "user", "content": "hi"}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
WEATHER_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"city": {"type": ["string", "null"]}, "unit": {"const": "C"}},
    "additionalProperties": False,
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather now",
        "parameters": WEATHER_SCHEMA,
    },
}


def body_for(provider: ProviderConfig = GEMINI, **fields: Any) -> dict[str, Any]:
    request = validate_chat_body({"model": "alias", "messages": [USER], **fields})
    return build_body(request, provider)


def check_with_sdk(body: dict[str, Any]) -> None:
    """Every part of a request body, through the SDK's models (unknown names are errors)."""
    assert set(body) <= {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig"}
    for content in body["contents"]:
        gtypes.Content.model_validate(content)
    if "systemInstruction" in body:
        gtypes.Content.model_validate(body["systemInstruction"])
    for tool in body.get("tools", ()):
        gtypes.Tool.model_validate(tool)
    if "toolConfig" in body:
        gtypes.ToolConfig.model_validate(body["toolConfig"])
    if "generationConfig" in body:
        gtypes.GenerationConfig.model_validate(body["generationConfig"])
