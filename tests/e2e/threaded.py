"""The simulator and a gateway on free ports, served by trio in a thread of their own: for a
synchronous test (hypothesis's ``@given``) that sends it many requests over real sockets
without starting a gateway per example."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import httpx
import trio

from tests.e2e.harness import FAST_SIM, gateway_config, provider_toml, running_gateway, running_sim
from trio_gateway.core.usage import UsageRecord

START_TIMEOUT_S = 30.0
# Answers at once: a test that sends many requests waits on the gateway, not on tokens.
INSTANT_SIM = attrs.evolve(
    FAST_SIM, decode_step_s=0.0, decode_step_s_per_seq=0.0, prefill_s_per_token=0.0
)
REQUEST_TIMEOUT_S = 20.0


@attrs.define
class Records:
    """The gateway's usage sink: every record, by request id."""

    by_id: dict[str, UsageRecord] = attrs.field(factory=dict)

    def offer(self, record: UsageRecord) -> bool:
        self.by_id[record.request_id] = record
        return True

    def wait_for(self, request_id: str, timeout_s: float = 5.0) -> UsageRecord:
        """The request's record: a refusal's is offered before its answer is sent, but a
        relayed request's may follow its answer's last byte."""
        deadline = time.monotonic() + timeout_s
        while request_id not in self.by_id:
            if time.monotonic() > deadline:
                raise AssertionError(f"no usage record for request {request_id}")
            time.sleep(0.002)
        return self.by_id[request_id]


@attrs.define
class ThreadedGateway:
    base_url: str
    records: Records
    # A client of the gateway's base URL, its connections kept alive between requests.
    http: httpx.Client


@contextmanager
def threaded_gateway(extra_toml: str = "") -> Iterator[ThreadedGateway]:
    """A gateway (alias ``agent-lite``) in front of the simulator, until the block ends."""
    ready = threading.Event()
    failed: list[BaseException] = []
    started: list[ThreadedGateway] = []
    stop: list[tuple[trio.lowlevel.TrioToken, trio.Event]] = []

    async def serve() -> None:
        async with running_sim(INSTANT_SIM) as sim:
            config = gateway_config(extra_toml + provider_toml("sim-a", sim.base_url))
            async with running_gateway(config) as gateway:
                records = Records()
                gateway.router.usage = records
                stopping = trio.Event()
                stop.append((trio.lowlevel.current_trio_token(), stopping))
                http = httpx.Client(base_url=gateway.base_url, timeout=REQUEST_TIMEOUT_S)
                started.append(ThreadedGateway(gateway.base_url, records, http))
                ready.set()
                await stopping.wait()

    def run() -> None:
        try:
            trio.run(serve)
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="threaded-gateway", daemon=True)
    thread.start()
    ready.wait(START_TIMEOUT_S)
    if failed or not started:
        raise RuntimeError("the threaded gateway did not start") from (
            failed[0] if failed else None
        )
    try:
        with started[0].http:
            yield started[0]
    finally:
        token, stopping = stop[0]
        token.run_sync_soon(stopping.set)
        thread.join(START_TIMEOUT_S)
