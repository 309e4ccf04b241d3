from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.e2e.harness import Stack, gateway_config, provider_toml, running_gateway, running_sim


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    """One simulator behind one gateway alias, both on real sockets."""
    async with running_sim() as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url))
        async with running_gateway(config) as gateway:
            yield Stack(sim=sim, gateway=gateway)
