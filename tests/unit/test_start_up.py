"""Start-up bookkeeping of a serving gateway: keys an older config may still hold that no longer
do anything are said to be unused (accepted must never look like applied), and what is alive at
start is frozen out of the cyclic collector's walks."""

from __future__ import annotations

import logging

import pytest

from trio_gateway.config.load import parse_config
from trio_gateway.fronts.app import open_keys
from trio_gateway.process.serve import warn_unused_keys

BASE = """
[aliases.a]
[[aliases.a.providers]]
name = "p"
type = "openai_compatible"
base_url = "http://127.0.0.1:9/v1"
model = "m"
"""


@pytest.mark.parametrize("value", [8, 64])
def test_stream_buffer_events_is_accepted_and_said_to_have_no_effect(
    caplog: pytest.LogCaptureFixture, value: int
) -> None:
    # Set to its old default too: what the file says is what is warned about.
    config = parse_config(f"[server]\nstream_buffer_events = {value}\n" + BASE, source="gw.toml")
    with caplog.at_level(logging.WARNING, logger="trio_gateway"):
        warn_unused_keys(config)
    [record] = caplog.records
    assert record.getMessage().startswith("gw.toml: server.stream_buffer_events: has no effect")


def test_a_config_without_it_gets_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="trio_gateway"):
        warn_unused_keys(parse_config(BASE))
    assert caplog.records == []


@pytest.mark.parametrize(
    ("listen", "level"), [("127.0.0.1:8080", logging.INFO), ("0.0.0.0:8080", logging.WARNING)]
)
def test_an_open_gateway_others_can_reach_is_a_warning(
    caplog: pytest.LogCaptureFixture, listen: str, level: int
) -> None:
    config = parse_config(f'[server]\nlisten = "{listen}"\n[auth]\nopen = true\n' + BASE)
    with caplog.at_level(logging.INFO, logger="trio_gateway"):
        assert open_keys(config) is None
    [record] = caplog.records
    assert record.levelno == level
    assert record.getMessage() == (
        f"auth: OPEN (no keys file): [auth] open = true, any caller reaching {listen} is served"
    )


def test_start_up_is_frozen_out_of_the_collector_s_walks() -> None:
    import gc

    from trio_gateway.process.serve import FULL_COLLECTION_EVERY, freeze_start_up

    before = gc.get_freeze_count()
    thresholds = gc.get_threshold()
    alive = [[i] for i in range(1000)]  # objects alive at start-up, as the gateway's are
    try:
        freeze_start_up()
        assert gc.get_freeze_count() >= before + len(alive)
        # A collection no longer walks them: generation 2 holds only what came after.
        assert not any(obj is alive[0] for obj in gc.get_objects(generation=2))
        # Full passes rarer; the young generations as they were.
        assert gc.get_threshold() == (*thresholds[:2], FULL_COLLECTION_EVERY)
    finally:
        # The test process runs many gateways: leave its collector as it was.
        gc.unfreeze()
        gc.set_threshold(*thresholds)
