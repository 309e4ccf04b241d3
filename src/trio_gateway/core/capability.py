"""What a provider can serve: the capabilities a request needs and an alias offers."""

from __future__ import annotations

import enum


class Capability(enum.Enum):
    TOOLS = "tools"
    VISION = "vision"
    JSON_SCHEMA = "json_schema"
    REASONING = "reasoning"
