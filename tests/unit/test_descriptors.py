"""Running out of descriptors: the tally and its log interval, the dial's error, the probe
that blames no provider, and the limit raised at start (core/descriptors.py,
http1/exhaustion.py, process/descriptors.py)."""

from __future__ import annotations

import errno
import json
import logging
import resource
import socket
from typing import Any

import h11
import pytest
import trio
import trio.testing

from tests.unit.test_health import config as provider_config
from tests.unit.test_health import state_of
from trio_gateway.capacity.health import ProviderHealth, State, probe_service
from trio_gateway.config.load import parse_config
from trio_gateway.core.descriptors import LOG_INTERVAL_S, DescriptorTally, is_exhaustion
from trio_gateway.core.errors import DescriptorsExhausted
from trio_gateway.http1 import dial
from trio_gateway.http1.exhaustion import REFUSAL, Reserve, refuse_one
from trio_gateway.process import descriptors


def test_the_tally_counts_every_time_and_says_so_once_an_interval() -> None:
    tally = DescriptorTally()
    assert tally.note("dial", 100.0) == 1  # the first one is said at once
    assert tally.note("dial", 101.0) is None
    assert tally.note("accept", 100.0 + LOG_INTERVAL_S - 0.01) is None
    assert tally.note("accept", 100.0 + LOG_INTERVAL_S) == 3  # the two unsaid and this one
    assert tally.by_place() == {"accept": 2, "dial": 2}


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (OSError(errno.EMFILE, "Too many open files"), True),
        (OSError(errno.ENFILE, "Too many open files in system"), True),
        (OSError(errno.ECONNREFUSED, "refused"), False),
        (ValueError("x"), False),
        (None, False),
    ],
)
def test_is_exhaustion(error: BaseException | None, expected: bool) -> None:
    assert is_exhaustion(error) is expected


def test_the_accept_refusal_is_a_whole_503_overloaded() -> None:
    # Judged by h11, a strict parser, not only by our own reading of it.
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="POST", target="/", headers=[("host", "x")]))
    client.receive_data(REFUSAL)
    response = client.next_event()
    assert isinstance(response, h11.Response) and response.status_code == 503
    assert (b"retry-after", b"1") in response.headers
    data = client.next_event()
    assert isinstance(data, h11.Data)
    assert json.loads(data.data)["error"]["code"] == "overloaded"
    assert isinstance(client.next_event(), h11.EndOfMessage)
    head, _, body = REFUSAL.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ")
    assert b"\r\nretry-after: 1" in head and b"\r\nconnection: close" in head
    assert f"content-length: {len(body)}".encode() in head
    assert b'"code": "overloaded"' in body


async def test_a_socket_the_process_cannot_open_is_the_oserror_not_a_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_descriptor(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(trio.socket, "socket", no_descriptor)
    with pytest.raises(OSError) as raised:
        await dial.open_tcp_stream("127.0.0.1", 9, rcvbuf_bytes=65536)
    assert raised.value.errno == errno.EMFILE


async def test_a_probe_out_of_descriptors_leaves_the_providers_state_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = provider_config(startup_grace_s=0.0, unhealthy_after=1)
    health = ProviderHealth(cfg, now=trio.current_time())
    health.success()
    calls = 0

    async def probe() -> None:
        nonlocal calls
        calls += 1
        raise DescriptorsExhausted("out of file descriptors")

    async with trio.open_nursery() as nursery:
        await nursery.start(probe_service, "p", cfg, health, probe)
        await trio.sleep(cfg.probe_interval_s * 3 + 1)
        nursery.cancel_scope.cancel()
    assert calls == 4
    assert state_of(health) is State.HEALTHY
    assert health.snapshot(trio.current_time()).consecutive_failures == 0


GATEWAY = """
[auth]
open = true
[aliases.a]
[[aliases.a.providers]]
name = "one"
type = "openai_compatible"
base_url = "http://127.0.0.1:1/v1"
model = "m"
max_inflight = 100
[[aliases.a.providers]]
name = "two"
type = "openai_compatible"
endpoints = ["http://127.0.0.1:2/v1", "http://127.0.0.1:3/v1"]
model = "m"
max_inflight = 50
"""


def test_descriptors_needed_counts_two_per_stream_of_every_replica() -> None:
    config = parse_config(GATEWAY, source="t.toml", environ={})
    assert descriptors.streams_at_most(config) == 100 + 2 * 50
    assert descriptors.descriptors_needed(config) == 2 * 200 + descriptors.OVERHEAD


@pytest.mark.parametrize(
    ("soft", "hard", "raised_to", "warns"),
    [
        (1024, 524288, 524288, False),  # raised to the hard limit: room enough
        (256, 300, 300, True),  # raised, and still short of 464
        (600, 600, None, False),  # already at the hard limit: nothing to set
        (1024, resource.RLIM_INFINITY, descriptors.UNLIMITED_CEILING, False),
    ],
)
def test_the_soft_limit_is_raised_to_the_hard_one_and_a_short_one_is_said(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    soft: int,
    hard: int,
    raised_to: int | None,
    warns: bool,
) -> None:
    set_to: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, hard))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: set_to.append(limits))
    config = parse_config(GATEWAY, source="t.toml", environ={})
    with caplog.at_level(logging.WARNING, logger="trio_gateway"):
        in_force = descriptors.raise_descriptor_limit(config)
    assert set_to == ([] if raised_to is None else [(raised_to, hard)])
    assert in_force == (soft if raised_to is None else raised_to)
    said = [r.getMessage() for r in caplog.records if "descriptor limit" in r.getMessage()]
    assert bool(said) is warns, said
    if warns:
        assert "(200 streams x 2 descriptors + 64 = 464)" in said[0]


async def test_the_accept_refusal_is_read_by_a_client_that_writes_its_body_first() -> None:
    """At the limit too, a client that writes its whole body before it reads gets its 503,
    not a reset in the middle of its writes (issue 39.8)."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        body = 8 << 20
        client = trio.socket.socket()
        await client.connect(listening.getsockname())
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: %d\r\n\r\n"
        answer = b""

        async def write_then_read() -> None:
            nonlocal answer
            with client:
                await client.send(head % body)
                sent, piece = 0, b"x" * 65536
                while sent < body:
                    sent += await client.send(piece)
                while data := await client.recv(65536):
                    answer += data

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_then_read)
            assert await refuse_one(listening, Reserve())
    assert answer == REFUSAL
