"""Cancellation that reaches the GPU: a client that leaves or stalls frees the upstream at once."""

from __future__ import annotations

import json
import socket

import attrs
import httpx
import pytest
import trio

from tests.e2e.harness import (
    FAST_SIM,
    Stack,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.sim import SimHandle

LONG = script({"text_tokens": 5000})


async def wait_for_abort(sim: SimHandle, aborts: int = 1, timeout_s: float = 5.0) -> None:
    """The simulator's stats are the only witness; poll them under a deadline."""
    await wait_until(
        lambda: sim.engine.stats().aborts >= aborts and not sim.engine.stats().running,
        timeout_s=timeout_s,
    )


def cancellations(gateway: GatewayHandle, cause: str) -> float:
    value = gateway.router.metrics.registry.get_sample_value(
        "gateway_cancellations_total", {"cause": cause}
    )
    return float(value or 0.0)


async def test_client_leaving_a_stream_aborts_the_upstream(stack: Stack) -> None:
    async with (
        httpx.AsyncClient() as client,
        client.stream(
            "POST", stack.v1 + "/chat/completions", json=chat(LONG, stream=True)
        ) as response,
    ):
        assert response.status_code == 200
        seen = 0
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen == 5:
                break
        generated_when_left = stack.sim.engine.stats().tokens_generated
    await wait_for_abort(stack.sim)
    stats = stack.sim.engine.stats()
    assert stats.aborts == 1
    assert stats.running == 0
    # The GPU stopped within a step or two of the client leaving: nowhere near 5000 tokens.
    assert stats.tokens_generated < generated_when_left + 20
    assert stats.tokens_generated_after_client_left <= 2
    upstream = stack.gateway.router.upstreams["sim-a"]
    await wait_until(lambda: upstream.statistics().in_flight == 0, timeout_s=2)
    await wait_until(lambda: cancellations(stack.gateway, "client_gone") == 1)


async def test_client_leaving_a_non_streamed_request_aborts_too(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        with trio.move_on_after(0.3):
            await client.post(stack.v1 + "/chat/completions", json=chat(LONG))
    await wait_for_abort(stack.sim)
    assert stack.sim.engine.stats().tokens_generated < 1000
    assert stack.gateway.router.upstreams["sim-a"].statistics().in_flight == 0


async def test_cancelled_requests_do_not_wedge_the_pool() -> None:
    """httpcore #1093: more requests than pool connections, cancelled just after they start,
    used to leak every pool slot for good. Three times the pool, cancelled early, then a normal
    request must still get through."""
    async with running_sim() as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url, max_inflight=2))
        async with running_gateway(config) as gateway:
            upstream = gateway.router.upstreams["sim-a"]
            pool_size = upstream.config.max_inflight + 2
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=100)) as client:

                async def start_and_leave(delay_s: float) -> None:
                    with trio.move_on_after(delay_s):
                        await client.post(
                            gateway.base_url + "/v1/chat/completions", json=chat(LONG)
                        )

                for round_ in range(3):
                    async with trio.open_nursery() as nursery:
                        for i in range(3 * pool_size):
                            nursery.start_soon(start_and_leave, 0.002 * (i % 5) + 0.001 * round_)
                with trio.fail_after(5):
                    response = await client.post(
                        gateway.base_url + "/v1/chat/completions",
                        json=chat(script({"text": "still here"})),
                    )
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["content"] == "still here"
            await wait_until(
                lambda: upstream.statistics().in_flight == 0 and not sim.engine.stats().running
            )


@pytest.mark.parametrize(
    "kernel_stall_drop", [True, False], ids=["tcp_user_timeout", "no_tcp_user_timeout"]
)
async def test_a_client_that_stops_reading_is_dropped_and_its_upstream_closed(
    kernel_stall_drop: bool,
) -> None:
    """With the kernel's TCP_USER_TIMEOUT off (a platform without it), only the gateway's own
    stall deadline can release the handler blocked writing to the client."""
    fast = attrs.evolve(FAST_SIM, decode_step_s=0.0002, decode_step_s_per_seq=0.0)
    async with running_sim(fast) as sim:
        config = gateway_config(
            provider_toml("sim-a", sim.base_url),
            server="client_stall_timeout_s = 0.5",
        )
        async with running_gateway(config, kernel_stall_drop=kernel_stall_drop) as gateway:
            host, port = gateway.base_url.removeprefix("http://").split(":")
            sock = trio.socket.socket()
            # A tiny receive window: the gateway's writes block almost at once.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.connect((host, int(port)))
            await stall_and_check(sock, host, sim, gateway)


async def stall_and_check(
    sock: trio.socket.SocketType, host: str, sim: SimHandle, gateway: GatewayHandle
) -> None:
    with sock:
        body = json.dumps(chat(script({"text_tokens": 200000}), stream=True)).encode()
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode() + body
        await sock.send(request)
        # Never read. The stall deadline must free the upstream long before 200k tokens.
        await wait_for_abort(sim, timeout_s=20)
        stats = sim.engine.stats()
        assert stats.tokens_generated < 200000
        upstream = gateway.router.upstreams["sim-a"]
        assert upstream.statistics().in_flight == 0
        # The gateway's own deadline let go of the upstream, not the kernel's drop later.
        await wait_until(lambda: cancellations(gateway, "client_stall") == 1)
        # Then the connection itself is dropped: the handler blocked on the write ends, well
        # before the kernel would have given up (TCP_USER_TIMEOUT = stall + 1 s).
        await wait_until(lambda: gateway.app.open_requests == 0, timeout_s=10)
        assert len(gateway.app.connections) == 0


async def test_a_client_that_reads_slower_than_the_answer_comes_is_dropped() -> None:
    """1 KiB every 10 ms is never "reading nothing" for the stall period (nor a write blocked
    that long: the kernel wakes the writer every few KiB), but it keeps the answer waiting most
    of the time: the gateway drops it by its own deadline (TCP_USER_TIMEOUT off, so the kernel
    cannot be what does it)."""
    fast = attrs.evolve(FAST_SIM, decode_step_s=0.0002, decode_step_s_per_seq=0.0)
    async with running_sim(fast) as sim:
        config = gateway_config(
            provider_toml("sim-a", sim.base_url),
            server="client_stall_timeout_s = 0.5",
        )
        async with running_gateway(config, kernel_stall_drop=False) as gateway:
            host, port = gateway.base_url.removeprefix("http://").split(":")
            sock = trio.socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.connect((host, int(port)))
            with sock:
                body = json.dumps(chat(script({"text_tokens": 200000}), stream=True)).encode()
                await sock.send(
                    (
                        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
                        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
                    ).encode()
                    + body
                )
                received = 0
                with trio.fail_after(20):
                    while True:
                        try:
                            data = await sock.recv(1024)
                        except ConnectionResetError:
                            break
                        if not data:
                            break
                        received += len(data)
                        await trio.sleep(0.01)
            assert received > 10_000  # it did read, steadily, until the gateway let it go
            assert cancellations(gateway, "client_stall") == 1
            await wait_for_abort(sim)
            assert sim.engine.stats().tokens_generated < 200000
            assert gateway.router.upstreams["sim-a"].statistics().in_flight == 0


async def test_a_client_that_keeps_up_is_not_dropped_when_the_gateway_is_behind() -> None:
    """An upstream faster than the gateway can relay keeps the producer waiting, as a slow
    client would; but this client's socket always has room, so it is not the one behind."""
    fast = attrs.evolve(FAST_SIM, decode_step_s=0.0, decode_step_s_per_seq=0.0, max_model_len=65536)
    async with running_sim(fast) as sim:
        config = gateway_config(
            provider_toml("sim-a", sim.base_url),
            server="client_stall_timeout_s = 0.2",
        )
        async with running_gateway(config) as gateway, httpx.AsyncClient() as client:
            started = trio.current_time()
            chunks = 0
            async with client.stream(
                "POST",
                gateway.base_url + "/v1/chat/completions",
                json=chat(script({"text_tokens": 30000}), stream=True, max_tokens=30000),
                timeout=60,
            ) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    chunks += line.startswith("data: {")
            # The stream outlasted the stall period many times over, and came whole.
            assert trio.current_time() - started > 1.0
            assert chunks >= 30000
            assert cancellations(gateway, "client_stall") == 0
            assert sim.engine.stats().aborts == 0
