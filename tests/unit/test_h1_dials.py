"""New connections to one provider are bounded (http1/client.py, ``max_dials_in_flight``): a
storm of requests against a server with a tiny listen backlog that accepts slowly dials a few
at a time, in order, and none fails with a connect timeout; one that waits past its turn is
refused as ``Overloaded``. Real sockets, a real listen queue."""

from __future__ import annotations

import socket

import pytest
import trio

from trio_gateway.core.errors import Overloaded, UpstreamUnreachable
from trio_gateway.http1.client import H1Pool

REQUESTS = 24
MAX_DIALS = 2
ACCEPT_EVERY_S = 0.03
# Shorter than the kernel's first SYN retransmission (1 s): a SYN the full queue dropped is a
# connect timeout.
CONNECT_TIMEOUT_S = 0.5


def pool(max_dials: int, dial_wait_s: float = 60.0) -> H1Pool:
    return H1Pool(
        "up", max_idle=0, idle_expiry_s=1, connect_timeout_s=CONNECT_TIMEOUT_S,
        write_timeout_s=5, environ={}, max_dials_in_flight=max_dials, dial_wait_s=dial_wait_s,
    )  # fmt: skip


async def slow_server(
    *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED, accept: bool = True
) -> None:
    """A backlog of one; one connection accepted every ACCEPT_EVERY_S, its request read and
    answered with a small whole response."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    task_status.started(listener.getsockname()[1])
    if not accept:
        await trio.sleep_forever()
    async with trio.open_nursery() as nursery:
        while True:
            await trio.sleep(ACCEPT_EVERY_S)
            conn, _ = await listener.accept()
            nursery.start_soon(answer, conn)


async def answer(conn: trio.socket.SocketType) -> None:
    with conn:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += await conn.recv(65536)
        await conn.send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")


async def storm(pool: H1Pool, port: int) -> list[str]:
    outcomes: list[str] = []

    async def one() -> None:
        try:
            response = await pool.post(f"http://127.0.0.1:{port}/v1/x", {}, b"{}")
        except UpstreamUnreachable as exc:
            outcomes.append(exc.message)
            return
        outcomes.append(str(response.status_code))
        await response.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(REQUESTS):
            nursery.start_soon(one)
    return outcomes


async def test_a_storm_dials_a_few_at_a_time_and_none_times_out() -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(slow_server)
        dials = pool(MAX_DIALS)
        outcomes = await storm(dials, port)
        nursery.cancel_scope.cancel()
    assert outcomes == ["200"] * REQUESTS, outcomes
    assert dials.dials_peak == MAX_DIALS
    assert dials.dial_statistics() == (0, 0, MAX_DIALS)


async def test_a_dial_that_waits_past_its_turn_is_refused_as_overloaded() -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: slow_server(task_status=task_status, accept=False)
        )
        dials = pool(1, dial_wait_s=0.2)
        url = f"http://127.0.0.1:{port}/v1/x"
        # The first is connected (the kernel completed its handshake) and waits for an
        # answer that never comes; the second waits for its turn to dial.
        nursery.start_soon(dials.post, url, {}, b"{}")
        await trio.sleep(0.05)
        with pytest.raises(Overloaded, match="new connections already waiting"):
            await dials.post(url, {}, b"{}")
        assert dials.dial_statistics() == (1, 0, 1)
        nursery.cancel_scope.cancel()


def test_the_kernel_drops_what_a_full_backlog_cannot_take() -> None:
    """The premise, on this machine: a listen queue of one, never accepted, leaves later
    connects waiting on SYN retransmissions (so the storm above would time out unbounded)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=1)
    port = listener.getsockname()[1]
    clients = []
    try:
        timed_out = 0
        for _ in range(6):
            client = socket.socket()
            client.settimeout(CONNECT_TIMEOUT_S)
            clients.append(client)
            try:
                client.connect(("127.0.0.1", port))
            except TimeoutError:
                timed_out += 1
        assert timed_out >= 1
    finally:
        for client in clients:
            client.close()
        listener.close()
