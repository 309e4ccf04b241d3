"""One gateway for a whole test module of client libraries, routed to simulators.

The clients are other people's code with their own event loops (asyncio, Node), so the gateway
does not run in the test's trio loop: it runs in a thread of its own, with its own ``trio.run``,
for as long as the module's tests; the tests are plain functions that talk to it over sockets,
as any client does. Its aliases:

- ``agent-lite``: vLLM's simulator (Qwen3-style: it reasons before it answers);
- ``claude``: Anthropic's simulator (signed thinking, which it wants back untouched mid tool
  loop, as Anthropic does);
- ``filtered``: vLLM's simulator behind the output filter ``secrets`` (``project-falcon``).

Every usage record the gateway writes is kept (``records``), for the tests to read by the
request ids their clients sent (``x-request-id``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import httpx
import trio

from tests.e2e.harness import FAST_SIM, running_gateway, running_sim
from trio_gateway.config.load import parse_config
from trio_gateway.core.usage import UsageRecord
from trio_gateway.sim import SimHandle

# Agent frameworks' prompts and the thinking budgets they ask for need room.
ROOMY = attrs.evolve(FAST_SIM, max_model_len=32768)
ANTHROPIC_KEY = "sk-ant-clients-0123456789abcdef"
START_TIMEOUT_S = 30.0
RECORD_TIMEOUT_S = 10.0
FILTERED_WORD = "project-falcon"


def config_text(vllm: SimHandle, anthropic: SimHandle) -> str:
    common = 'capabilities = ["tools", "reasoning", "json_schema"]\nprobe = false\n'
    # A vLLM provider lowers `max_tokens` to this (agent clients ask for more than the model
    # holds, thinking budget included).
    vllm_provider = f"""type = "openai_compatible"
base_url = "{vllm.base_url}/v1"
model = "qwen3-32b"
api_key_env = "SIM_KEY"
max_output_tokens = 8000
{common}"""
    return f"""
[server]
listen = "127.0.0.1:0"

[filters.secrets]
patterns = ["{FILTERED_WORD}"]

[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "vllm"
{vllm_provider}
[aliases.claude]
[[aliases.claude.providers]]
name = "anthropic"
type = "anthropic"
base_url = "{anthropic.base_url}"
model = "qwen3-32b"
api_key_env = "ANTHROPIC_KEY"
{common}
[aliases.filtered]
output_filters = ["secrets"]
[[aliases.filtered.providers]]
name = "vllm-filtered"
{vllm_provider}"""


@attrs.define
class Records:
    """The gateway's usage sink: written from the gateway's thread, read from the test's."""

    records: list[UsageRecord] = attrs.field(factory=list)
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def offer(self, record: UsageRecord) -> bool:
        with self.lock:
            self.records.append(record)
        return True

    def of(self, name: str) -> list[UsageRecord]:
        """The records of the requests whose id is ``name``, or ``name-`` and a suffix."""
        with self.lock:
            return [
                r
                for r in self.records
                if r.request_id == name or r.request_id.startswith(name + "-")
            ]

    def wait_for(self, name: str, count: int) -> list[UsageRecord]:
        """``count`` records of ``name`` (:meth:`of`): a record is written when its answer
        ends, which may be just after the client read that end. Polled under a deadline (the
        gateway's thread announces nothing to this one)."""
        deadline = time.monotonic() + RECORD_TIMEOUT_S
        while len(found := self.of(name)) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return found


@attrs.define
class ClientStack:
    base_url: str  # the gateway's, without /v1
    sims: dict[str, str]  # alias → its simulator's base URL
    records: Records

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def sent_upstream(self, alias: str, request_id: str) -> list[dict[str, Any]]:
        """The bodies the gateway sent the alias's simulator for requests of id ``request_id``
        (the gateway passes the client's id on), oldest first, among the last 16 the simulator
        keeps."""
        stats = httpx.get(self.sims[alias] + "/sim/stats?bodies=1", timeout=10).json()
        pairs = zip(stats["last_request_headers"], stats["last_request_bodies"], strict=True)
        return [b for h, b in pairs if h.get("x-request-id") == request_id]


@contextmanager
def client_stack() -> Iterator[ClientStack]:
    """The simulators and the gateway, serving in a thread until the block ends."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        anthropic_sim = attrs.evolve(ROOMY, dialect="anthropic", api_key=ANTHROPIC_KEY)
        async with running_sim(ROOMY) as vllm, running_sim(anthropic_sim) as anthropic:
            environ = {"SIM_KEY": ROOMY.api_key or "", "ANTHROPIC_KEY": ANTHROPIC_KEY}
            config = parse_config(
                config_text(vllm, anthropic), source="clients.toml", environ=environ
            )
            async with running_gateway(config) as gateway:
                records = Records()
                gateway.router.usage = records
                stop = trio.Event()
                box["stop"] = stop
                box["token"] = trio.lowlevel.current_trio_token()
                box["stack"] = ClientStack(
                    base_url=gateway.base_url,
                    sims={
                        "agent-lite": vllm.base_url,
                        "filtered": vllm.base_url,
                        "claude": anthropic.base_url,
                    },
                    records=records,
                )
                ready.set()
                await stop.wait()

    def main() -> None:
        try:
            trio.run(serve)
        except BaseException as error:  # handed to the test's thread
            box["error"] = error
        finally:
            ready.set()

    thread = threading.Thread(target=main, name="client-stack", daemon=True)
    thread.start()
    if not ready.wait(START_TIMEOUT_S) or "stack" not in box:
        raise RuntimeError("the gateway did not start") from box.get("error")
    try:
        yield box["stack"]
    finally:
        trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
        thread.join(START_TIMEOUT_S)
        if "error" in box:
            raise box["error"]
