"""A gateway on a managed Redis that speaks TLS only: ``rediss://`` with ``[redis] ca_file``
from the config, through ``serve`` (budgets and the usage stream)."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from tests.e2e.harness import running_sim
from tests.e2e.test_limits import TIMEOUT_S, gateway, post, write_keys
from tests.redis_server import running_redis
from tests.unit.test_h1_client_tls import make_ca_and_server
from trio_gateway.accounting.limit_store import RedisStore
from trio_gateway.redis.client import open_redis


async def test_budgets_and_usage_over_rediss_with_the_config_s_ca_file(tmp_path: Path) -> None:
    keys_file, key = write_keys(tmp_path, "budget = 10.0")
    ca, _ = make_ca_and_server(tmp_path)
    tls = (str(tmp_path / "server.pem"), str(ca))
    async with running_redis(tls=tls) as redis, running_sim() as sim:
        toml = (
            f'[redis]\nurl = "{redis.url}"\nca_file = "{ca}"\ntimeout_s = 2\n'
            'on_error = "fail_closed"\nkey_prefix = "s:"\n'
            '[usage]\nsink = "redis_stream"\nstream = "s:usage"\n'
        )
        async with (
            gateway(sim.base_url, keys_file, toml) as gw,
            httpx.AsyncClient(timeout=TIMEOUT_S) as client,
            open_redis(redis.url, ca_file=str(ca)) as shared,
        ):
            answer = await post(client, gw.base_url, key, max_tokens=10)
            assert answer.status_code == 200, answer.text
            store = RedisStore(shared, "s:")
            # Settled and recorded after the answer: no event of the gateway's to wait on.
            with trio.fail_after(5):
                while True:
                    if not await store.live_holds("alice") and await shared._redis.xlen("s:usage"):
                        break
                    await trio.sleep(0.02)
            assert await store.spent("alice") > 0
