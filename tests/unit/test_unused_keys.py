"""Keys an older config may still hold that no longer do anything are accepted, and said to be
unused at start: accepted must never look like applied."""

from __future__ import annotations

import logging

import pytest

from trio_gateway.config import parse_config
from trio_gateway.server import warn_unused_keys

BASE = """
[aliases.a]
[[aliases.a.providers]]
name = "p"
type = "openai_compatible"
base_url = "http://127.0.0.1:9/v1"
model = "m"
"""


def test_stream_buffer_events_is_accepted_and_said_to_have_no_effect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = parse_config("[server]\nstream_buffer_events = 8\n" + BASE)
    with caplog.at_level(logging.WARNING, logger="trio_gateway"):
        warn_unused_keys(config)
    [record] = caplog.records
    assert record.getMessage().startswith("server.stream_buffer_events = 8 has no effect")


def test_a_config_without_it_gets_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="trio_gateway"):
        warn_unused_keys(parse_config(BASE))
    assert caplog.records == []
