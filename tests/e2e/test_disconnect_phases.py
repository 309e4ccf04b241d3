"""The client's leaving, seen in every phase of a request: waiting for a gate slot, dialing the
upstream, waiting for its head, streaming, and after the last byte (docs/architecture.md,
"Cancellation"). Each client is a real socket that closes; each witness is the upstream's own:
the simulator's abort counter, or a fake upstream that reads the gateway's end."""

from __future__ import annotations

import json
import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio

from tests.e2e.harness import (
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from tests.e2e.test_cancellation import cancellations, wait_for_abort
from tests.e2e.test_upstream_faults import fake_upstream, linger_after_done
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.sim import SimHandle

LONG = script({"text_tokens": 5000})
QUEUE_30_S = "queue_timeout_s = 30"  # waits at the gate, never spills
MODES = [pytest.param(True, id="stream"), pytest.param(False, id="whole")]


def outcomes(gateway: GatewayHandle, outcome: str, code: str = "") -> float:
    value = gateway.router.metrics.registry.get_sample_value(
        "gateway_requests_total",
        {"alias": "agent-lite", "provider": _provider(gateway), "outcome": outcome, "code": code},
    )
    return float(value or 0.0)


def one_sim(sim: SimHandle) -> GatewayConfig:
    return gateway_config(provider_toml("sim-a", sim.base_url))


def _provider(gateway: GatewayHandle) -> str:
    return next(iter(gateway.router.upstreams))


async def send_request(gateway: GatewayHandle, body: dict[str, Any]) -> trio.socket.SocketType:
    """A client on a socket of its own, its request sent whole; the caller closes it."""
    host, port = gateway.base_url.removeprefix("http://").split(":")
    sock = trio.socket.socket()
    await sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    while request:
        request = request[await sock.send(request) :]
    return sock


async def read_until(sock: trio.socket.SocketType, marker: bytes) -> bytes:
    got = b""
    with trio.fail_after(10):
        while marker not in got:
            data = await sock.recv(65536)
            assert data, f"closed before {marker!r}: {got[-300:]!r}"
            got += data
    return got


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
@pytest.mark.parametrize("stream", MODES)
async def test_clients_that_leave_while_queued_never_reach_the_upstream(
    stream: bool, reset: bool
) -> None:
    """Three clients wait for the one slot; they leave, each closing its connection or (with
    unread bytes, or ``SO_LINGER`` 0) resetting it: an error on the socket, not an end."""
    async with running_sim() as sim:
        provider = provider_toml("sim-a", sim.base_url, max_inflight=1, extra=QUEUE_30_S)
        async with running_gateway(gateway_config(provider)) as gateway:
            upstream = gateway.router.upstreams["sim-a"]
            first = await send_request(gateway, chat(LONG, stream=True))
            await wait_until(lambda: sim.engine.stats().running == 1)
            queued = [await send_request(gateway, chat(LONG, stream=stream)) for _ in range(3)]
            await wait_until(lambda: upstream.statistics().waiting == 3)
            for sock in queued:
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                sock.close()
            # Seen while they wait, not when a slot frees: the first answer is still running.
            await wait_until(lambda: cancellations(gateway, "client_gone") == 3, timeout_s=2)
            assert upstream.statistics().waiting == 0
            assert sim.engine.stats().running == 1
            first.close()
            await wait_for_abort(sim)
            await wait_until(lambda: upstream.statistics().in_flight == 0)
            assert sim.engine.stats().requests == 1  # the queued ones never went upstream
            assert cancellations(gateway, "client_gone") == 4


async def test_many_clients_leaving_at_random_moments_leave_nothing_running() -> None:
    """A small soak: 40 clients on 4 slots, each leaving at a random moment of its request
    (queued, dialing, waiting for the head, streaming). Afterwards nothing runs upstream for
    nobody, and every request is recorded cancelled."""
    rng = random.Random(7)
    async with running_sim() as sim:
        provider = provider_toml("sim-a", sim.base_url, max_inflight=4, extra=QUEUE_30_S)
        async with running_gateway(gateway_config(provider)) as gateway:
            upstream = gateway.router.upstreams["sim-a"]

            async def leave_after(delay_s: float, stream: bool) -> None:
                sock = await send_request(gateway, chat(LONG, stream=stream))
                with trio.move_on_after(delay_s):
                    while await sock.recv(65536):
                        pass
                sock.close()

            async with trio.open_nursery() as nursery:
                for i in range(40):
                    nursery.start_soon(leave_after, rng.uniform(0.0, 0.4), i % 3 != 0)
            await wait_until(
                lambda: (
                    upstream.statistics().in_flight == 0
                    and upstream.statistics().waiting == 0
                    and gateway.app.open_requests == 0
                )
            )
            stats = sim.engine.stats()
            assert (stats.running, stats.waiting) == (0, 0)
            assert stats.aborts == stats.requests  # none ran to its end for nobody
            assert stats.tokens_generated < 40 * 5000 // 10
            assert cancellations(gateway, "client_gone") == 40


@asynccontextmanager
async def unanswering_listener() -> AsyncIterator[tuple[str, trio.Event]]:
    """An address whose accept queue is full: a connect to it waits (its SYNs are dropped), as
    to a host that does not answer. The event is set if a connection ever gets through."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers: list[socket.socket] = []
    while True:
        filler = socket.socket()
        filler.setblocking(False)
        fillers.append(filler)
        if filler.connect_ex(address) not in (0, 115):  # EINPROGRESS
            break
        with trio.move_on_after(0.2) as pending:
            await trio.lowlevel.wait_writable(filler)
        if pending.cancelled_caught:
            break  # this one's SYN went unanswered: the queue is full
    got_through = trio.Event()
    try:
        yield f"http://127.0.0.1:{address[1]}", got_through
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@pytest.mark.parametrize("stream", MODES)
async def test_a_client_that_leaves_while_the_gateway_dials_ends_the_dial(stream: bool) -> None:
    async with unanswering_listener() as (base_url, _):
        provider = provider_toml(
            "silent", base_url, api_key_env=None, extra="connect_timeout_s = 30"
        )
        async with running_gateway(gateway_config(provider)) as gateway:
            upstream = gateway.router.upstreams["silent"]
            client = await send_request(gateway, chat("hello", stream=stream))
            await wait_until(lambda: upstream.statistics().in_flight == 1)
            await trio.sleep(0.1)  # well into the dial, far from its 30 s timeout
            client.close()
            with trio.fail_after(2):
                await wait_until(lambda: cancellations(gateway, "client_gone") == 1)
                await wait_until(lambda: upstream.statistics().in_flight == 0)
                await wait_until(lambda: gateway.app.open_requests == 0)


@asynccontextmanager
async def silent_upstream() -> AsyncIterator[tuple[str, trio.Event, trio.Event]]:
    """An upstream that reads a request and never answers: (its URL, set when a request came,
    set when the gateway then closed the connection)."""
    came, closed = trio.Event(), trio.Event()

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                while await stream.receive_some(65536):
                    came.set()
            except trio.BrokenResourceError:
                pass
            closed.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}", came, closed
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("stream", MODES)
async def test_a_client_that_leaves_before_the_upstreams_head_closes_the_upstream(
    stream: bool,
) -> None:
    async with silent_upstream() as (base_url, came, closed):
        provider = provider_toml("silent", base_url, api_key_env=None)
        async with running_gateway(gateway_config(provider)) as gateway:
            client = await send_request(gateway, chat("hello", stream=stream))
            with trio.fail_after(5):
                await came.wait()
            client.close()
            with trio.fail_after(2):
                await closed.wait()
            await wait_until(lambda: cancellations(gateway, "client_gone") == 1)
            # The exchange ended by the hang-up is no failure of the provider's.
            health = gateway.router.health["silent"]
            assert health.snapshot(trio.current_time()).consecutive_failures == 0


async def test_a_whole_answer_whose_client_leaves_while_it_is_generated_aborts() -> None:
    """The simulator sends a whole answer's head only when it is generated: the client leaves
    while the gateway waits for it."""
    async with running_sim() as sim, running_gateway(one_sim(sim)) as gateway:
        client = await send_request(gateway, chat(LONG))
        await wait_until(lambda: sim.engine.stats().running == 1)
        client.close()
        await wait_for_abort(sim)
        assert sim.engine.stats().tokens_generated < 5000
        await wait_until(lambda: cancellations(gateway, "client_gone") == 1)


async def test_a_client_that_leaves_mid_stream_aborts_the_upstream() -> None:
    async with running_sim() as sim, running_gateway(one_sim(sim)) as gateway:
        client = await send_request(gateway, chat(LONG, stream=True))
        await read_until(client, b'"content"')
        client.close()
        await wait_for_abort(sim)
        assert sim.engine.stats().tokens_generated < 5000
        await wait_until(lambda: cancellations(gateway, "client_gone") == 1)


async def test_a_client_that_closes_after_the_last_event_is_not_a_cancellation() -> None:
    """The openai SDK (sync) closes the connection as soon as it reads ``[DONE]``, without the
    body's last chunk; the gateway meanwhile reads the upstream's own end (here an upstream
    that lingers after its ``[DONE]``). The client has its whole answer: completed."""

    async with fake_upstream(linger_after_done) as base_url:
        config = gateway_config(provider_toml("fake", base_url, api_key_env=None))
        async with running_gateway(config) as gateway:
            client = await send_request(gateway, chat("hello", stream=True))
            await read_until(client, b"data: [DONE]\n\n")
            client.close()
            await wait_until(lambda: gateway.app.open_requests == 0)
            assert outcomes(gateway, "ok") == 1
            assert cancellations(gateway, "client_gone") == 0
