"""``[server] workers = 2`` without Redis: the workers share every limit through their
supervisor (process/host_broker.py), as one process would keep it. Run as a user runs it
(``trio-gateway serve``), with the embedded simulator as the upstream: its counters say what
ran. Each test picks the worker of a connection by asking ``/healthz`` on it first (it answers
with the worker's pid), then sends its requests down that same keep-alive connection."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from bench.processes import free_port

from tests.e2e.test_cli import CLI, wait_ready
from trio_gateway.core.keys import hash_key, new_key

MAX_INFLIGHT = 3
LONG_TOKENS = 3000  # 60 s at the simulator's pace: a stream that runs until it is let go
# A killed worker's slots come back when the supervisor sees it go (a few ms when idle); this
# is the bound on a loaded 2-core machine.
KILLED_SLOTS_BACK_S = 3.0
WAIT_S = 20.0


@attrs.frozen
class Host:
    proc: subprocess.Popen[bytes]
    base: str
    sim: str
    log: Path
    keys: dict[str, str]


def config_text(port: int, sim_port: int, keys_file: Path) -> str:
    return f"""
[server]
listen = "127.0.0.1:{port}"
workers = 2
drain_timeout_s = 2.0
# /healthz names the worker's pid only to the operator; these tests ask it with users' keys.
status = "open"

[auth]
keys_file = "{keys_file}"

[simulators.sim]
listen = "127.0.0.1:{sim_port}"
served_model_name = "m"
max_num_seqs = 64
decode_step_s = 0.02

[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "sim"
type = "openai_compatible"
base_url = "http://127.0.0.1:{sim_port}/v1"
model = "m"
max_inflight = {MAX_INFLIGHT}
queue_timeout_s = 60.0
probe = false
# One unit of budget per output token.
price_output_per_mtok = 1000000.0
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    tmp = tmp_path_factory.mktemp("workers-share")
    keys = {name: new_key() for name in ("free", "rpm", "budget")}
    limits = {"free": "", "rpm": "rpm = 2", "budget": "budget = 12.0"}
    keys_file = tmp / "keys.toml"
    keys_file.write_text(
        "".join(
            f'[keys.{name}]\nsha256 = "{hash_key(key)}"\n{limits[name]}\n'
            for name, key in keys.items()
        )
    )
    port, sim_port = free_port(), free_port()
    path = tmp / "gateway.toml"
    path.write_text(config_text(port, sim_port, keys_file))
    log = tmp / "stderr.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen([*CLI, "serve", "--config", str(path)], stderr=stderr)
    try:
        wait_ready(port, proc)
        yield Host(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{sim_port}/sim", log, keys)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def sim_stats(host: Host) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5) as client:
        stats: dict[str, Any] = (await client.get(f"{host.sim}/stats?bodies=1")).json()
        return stats


async def reset_sim(host: Host) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        await client.post(f"{host.sim}/reset")


async def until(host: Host, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The simulator's stats once ``predicate`` holds (polled; fails after WAIT_S)."""
    with trio.fail_after(WAIT_S):
        while not predicate(stats := await sim_stats(host)):  # noqa: ASYNC110 - another process
            await trio.sleep(0.02)
    return stats


@asynccontextmanager
async def connections(
    host: Host, key: str, wanted: Callable[[dict[int, list[httpx.AsyncClient]]], bool]
) -> AsyncIterator[dict[int, list[httpx.AsyncClient]]]:
    """Keep-alive connections grouped by the worker that accepted them, opened until
    ``wanted`` says there are enough."""
    async with AsyncExitStack() as stack:
        by_pid: dict[int, list[httpx.AsyncClient]] = {}
        with trio.fail_after(WAIT_S):
            while not wanted(by_pid):
                client = await stack.enter_async_context(
                    httpx.AsyncClient(
                        base_url=host.base,
                        timeout=60,
                        headers={"authorization": f"Bearer {key}"},
                        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                    )
                )
                pid = (await client.get("/healthz")).json()["pid"]
                by_pid.setdefault(pid, []).append(client)
        yield by_pid


def body(content: str, tokens: int, *, stream: bool = True) -> dict[str, Any]:
    return {
        "model": "agent-lite",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "stream": stream,
    }


async def hold(
    client: httpx.AsyncClient,
    content: str,
    started: trio.Event,
    *,
    priority: int | None = None,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A long stream, until its scope is cancelled (the connection closes: the gateway lets
    its slot go). ``started``: its first bytes came (it holds a slot)."""
    headers = {} if priority is None else {"x-priority": str(priority)}
    with trio.CancelScope() as scope:
        task_status.started(scope)
        request = body(content, LONG_TOKENS)
        async with client.stream(
            "POST", "/v1/chat/completions", json=request, headers=headers
        ) as response:
            assert response.status_code == 200
            async for _ in response.aiter_raw():
                started.set()


async def queued_at(client: httpx.AsyncClient) -> int:
    """Requests of this connection's worker waiting for a slot of the provider."""
    text = (await client.get("/metrics")).text
    gauge = 'gateway_provider_queued{provider="sim"}'
    line = next(x for x in text.splitlines() if x.startswith(gauge))
    return int(float(line.split()[-1]))


async def until_queued(client: httpx.AsyncClient, count: int) -> None:
    with trio.fail_after(WAIT_S):
        while await queued_at(client) != count:  # noqa: ASYNC110 - another process
            await trio.sleep(0.02)


async def first_set(events: list[trio.Event], count: int) -> list[int]:
    """The indexes of the first ``count`` of ``events`` to be set, in order."""
    done: list[int] = []
    async with trio.open_nursery() as nursery:

        async def wait(index: int) -> None:
            await events[index].wait()
            done.append(index)
            if len(done) == count:
                nursery.cancel_scope.cancel()

        for index in range(len(events)):
            nursery.start_soon(wait, index)
    return sorted(done)


async def through_the_broker(client: httpx.AsyncClient) -> None:
    """A round trip from this connection's worker through the host broker: the status page
    asks it what the budget key spent. The broker reads a worker's messages in order, so
    every ask the worker sent before has reached it once this returns."""
    response = await client.get("/status.json")
    assert response.status_code == 200, response.text
    assert any(line["name"] == "budget" for line in response.json()["keys"]["budgets"])


def first_of(by_pid: dict[int, list[httpx.AsyncClient]], count: int) -> int | None:
    return next((pid for pid, clients in by_pid.items() if len(clients) >= count), None)


async def test_three_run_at_once_on_one_worker_and_the_fourth_waits(host: Host) -> None:
    """max_inflight = 3 over 2 workers, 4 streams all on one worker: 3 run (split, that worker
    had 1), the 4th waits for the first slot freed."""
    await reset_sim(host)
    key = host.keys["free"]
    async with connections(host, key, lambda g: first_of(g, 4) is not None) as by_pid:
        clients = by_pid[first_of(by_pid, 4) or 0][:4]
        started = [trio.Event() for _ in clients]
        async with trio.open_nursery() as nursery:
            scopes = [
                await nursery.start(hold, c, f"s{i}", e)
                for i, (c, e) in enumerate(zip(clients, started, strict=True))
            ]
            stats = await until(host, lambda s: s["running"] == MAX_INFLIGHT)
            # The fourth is not upstream: it waits at the gate.
            assert stats["requests"] == MAX_INFLIGHT
            # The simulator counts a stream before its first bytes reach the client.
            with trio.fail_after(WAIT_S):
                running = await first_set(started, MAX_INFLIGHT)
            waiting = [i for i, e in enumerate(started) if not e.is_set()]
            assert len(waiting) == 1 and len(running) == MAX_INFLIGHT, (waiting, running)
            scopes[running[0]].cancel()
            await started[waiting[0]].wait()
            stats = await until(host, lambda s: s["requests"] == MAX_INFLIGHT + 1)
            assert stats["max_running_seen"] == MAX_INFLIGHT
            nursery.cancel_scope.cancel()


async def test_waiters_of_both_workers_are_served_in_priority_order(host: Host) -> None:
    """A low-priority request waiting on one worker is passed by a better one that came later
    on the other worker; each freed slot goes to the best waiter of the host."""
    await reset_sim(host)
    key = host.keys["free"]
    two_each = lambda g: sum(len(c) >= 2 for c in g.values()) >= 2  # noqa: E731
    async with connections(host, key, two_each) as by_pid:
        (a_low, a_metrics), (b_high, b_metrics) = [c[:2] for c in by_pid.values() if len(c) >= 2][
            :2
        ]
        async with connections(host, key, lambda g: sum(map(len, g.values())) >= 3) as holders:
            holding = [c for clients in holders.values() for c in clients][:MAX_INFLIGHT]
            held = [trio.Event() for _ in holding]
            async with trio.open_nursery() as nursery:
                scopes = [
                    await nursery.start(hold, c, f"holder{i}", e)
                    for i, (c, e) in enumerate(zip(holding, held, strict=True))
                ]
                # Every holder's first bytes came: each holds a slot. (The simulator's count of
                # running streams may still hold the last test's, aborted as this one starts:
                # CI saw "low" take a slot a holder had not asked for yet.)
                with trio.fail_after(WAIT_S):
                    await first_set(held, MAX_INFLIGHT)
                low, high = trio.Event(), trio.Event()
                # Five classes lower: served as if it had come 10 s later (aging 2 s a class).
                await nursery.start(partial(hold, a_low, "low", low, priority=5))
                await until_queued(a_metrics, 1)
                await nursery.start(hold, b_high, "high", high)
                await until_queued(b_metrics, 1)
                # The worker counts its waiter before its ask reaches the broker: a release
                # that got there first would go to the only waiter the broker knew, low.
                await through_the_broker(b_metrics)
                assert not low.is_set() and not high.is_set()
                scopes[0].cancel()
                await high.wait()
                assert not low.is_set()
                scopes[1].cancel()
                await low.wait()
                stats = await sim_stats(host)
                contents = [b["messages"][0]["content"] for b in stats["last_request_bodies"]]
                assert contents[-2:] == ["high", "low"], contents
                nursery.cancel_scope.cancel()


async def test_a_keys_rate_limit_and_budget_hold_across_the_workers(host: Host) -> None:
    """rpm = 2: one request on each worker, then both refuse. A budget of 12 units at one a
    token: 5 spent on one worker and 5 on the other leave 2, less than the next hold of 5."""
    await reset_sim(host)
    for name, refused in (("rpm", 429), ("budget", 402)):
        both = lambda g: len(g) == 2  # noqa: E731
        async with connections(host, host.keys[name], both) as by_pid:
            a, b = (clients[0] for clients in by_pid.values())
            statuses = []
            for client in (a, b, a, b):
                request = body("hi", 5, stream=False)
                response = await client.post("/v1/chat/completions", json=request)
                statuses.append(response.status_code)
                if response.status_code == 200:
                    assert response.json()["usage"]["completion_tokens"] == 5
            assert statuses == [200, 200, refused, refused], (name, statuses)


async def test_a_killed_workers_slots_come_back_at_once_and_it_is_started_again(
    host: Host,
) -> None:
    """Three streams on one worker hold every slot while a fourth waits on the other; kill -9
    the first: the fourth runs within KILLED_SLOTS_BACK_S. The supervisor starts a new worker,
    which shares the limit as the old one did."""
    await reset_sim(host)
    key = host.keys["free"]

    def enough(g: dict[int, list[httpx.AsyncClient]]) -> bool:
        victim = first_of(g, MAX_INFLIGHT)
        return victim is not None and any(len(c) >= 2 for p, c in g.items() if p != victim)

    async with connections(host, key, enough) as by_pid:
        victim = first_of(by_pid, MAX_INFLIGHT)
        assert victim is not None
        (other,) = (pid for pid in by_pid if pid != victim)
        waiter_started = trio.Event()
        victims = [trio.Event() for _ in range(MAX_INFLIGHT)]
        async with trio.open_nursery() as nursery:
            for i, client in enumerate(by_pid[victim][:MAX_INFLIGHT]):
                nursery.start_soon(_until_cut, client, f"victim{i}", victims[i])
            # Their first bytes, not the simulator's count of running streams: that may still
            # hold the last test's, aborted as this one starts.
            with trio.fail_after(WAIT_S):
                await first_set(victims, MAX_INFLIGHT)
            await nursery.start(hold, by_pid[other][0], "waiter", waiter_started)
            await until_queued(by_pid[other][1], 1)
            assert not waiter_started.is_set()
            killed_at = trio.current_time()
            os.kill(victim, signal.SIGKILL)
            with trio.fail_after(WAIT_S):
                await waiter_started.wait()
            assert trio.current_time() - killed_at < KILLED_SLOTS_BACK_S
            nursery.cancel_scope.cancel()
    with trio.fail_after(WAIT_S):
        while "exited with -9; starting it again" not in host.log.read_text():  # noqa: ASYNC110
            await trio.sleep(0.05)
    # The new worker and the old one share the limit: two streams on each, 3 run (split,
    # each would run 1).
    await reset_sim(host)
    # Two streams on each worker and a third connection to read its gauge.
    three_each = lambda g: len(g) == 2 and all(len(c) >= 3 for c in g.values())  # noqa: E731
    async with connections(host, key, three_each) as by_pid:
        assert victim not in by_pid
        clients = [c for cs in by_pid.values() for c in cs[:2]]
        started = [trio.Event() for _ in clients]
        async with trio.open_nursery() as nursery:
            for i, (client, event) in enumerate(zip(clients, started, strict=True)):
                await nursery.start(hold, client, f"after{i}", event)
            with trio.fail_after(WAIT_S):
                await first_set(started, MAX_INFLIGHT)
            # The fourth waits at the gate: it never reached the simulator.
            with trio.fail_after(WAIT_S):
                while await queued_on_the_host(by_pid) != 1:  # noqa: ASYNC110 - other processes
                    await trio.sleep(0.02)
            assert (await sim_stats(host))["requests"] == MAX_INFLIGHT
            nursery.cancel_scope.cancel()


async def _until_cut(client: httpx.AsyncClient, content: str, started: trio.Event) -> None:
    with contextlib.suppress(httpx.TransportError):  # its worker was killed
        await hold(client, content, started)


async def queued_on_the_host(by_pid: dict[int, list[httpx.AsyncClient]]) -> int:
    """Requests waiting for a slot, over every worker (each asked on its third connection:
    the first two are busy streaming)."""
    total = 0
    for clients in by_pid.values():
        total += await queued_at(clients[2])
    return total
