"""A real redis-server on a free port, for tests. A missing binary fails the test: never skips."""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import coredis
import pytest
import trio
from bench.processes import free_port

from trio_gateway.redis.client import RedisError, open_redis

REDIS_BINARY = "redis-server"
START_TIMEOUT_S = 10.0


class RedisServer:
    """One redis-server process; ``kill`` and ``start`` again on the same port."""

    def __init__(
        self,
        port: int,
        *,
        tls: tuple[str, str] | None = None,
        cluster_dir: str | None = None,
        slots: tuple[int, int] = (0, 16383),
    ) -> None:
        """``tls``: the server's certificate chain and key in one PEM file, and its CA's
        certificate: TLS only (``rediss://localhost``), no client certificate asked for.
        ``cluster_dir``: a node of a Redis Cluster (its state file there) holding ``slots``;
        a cluster refuses a script whose keys are in different slots (CROSSSLOT)."""
        self.port = port
        self.tls = tls
        self.cluster_dir = cluster_dir
        self.slots = slots
        scheme, host = ("rediss", "localhost") if tls else ("redis", "127.0.0.1")
        self.url = f"{scheme}://{host}:{port}/0"
        self.ca_file = tls[1] if tls else None
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        binary = shutil.which(REDIS_BINARY)
        if binary is None:
            pytest.fail(
                f"{REDIS_BINARY} is not installed (PATH has no {REDIS_BINARY}): these tests need "
                "a real Redis; install it (apt-get install redis-server)"
            )
        ports = ["--port", str(self.port)]
        if self.tls is not None:
            chain, ca = self.tls
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            ports += ["--tls-cert-file", chain, "--tls-key-file", chain, "--tls-ca-cert-file", ca]
        if self.cluster_dir is not None:
            ports += ["--cluster-enabled", "yes", "--dir", self.cluster_dir]
        self.process = subprocess.Popen(  # noqa: ASYNC220 - starts and returns at once
            [
                binary,
                *ports,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # The port first: a client's pool whose connection is refused fails as a whole, not
        # only its ping (a loaded machine starts redis-server later than its Popen returns).
        with trio.fail_after(START_TIMEOUT_S):
            while True:
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", self.port)
                except OSError:
                    await trio.sleep(0.02)  # another process: nothing to wait on but the clock
                    continue
                await stream.aclose()
                break
        async with open_redis(self.url, ca_file=self.ca_file) as client:
            with trio.fail_after(START_TIMEOUT_S):
                while True:
                    try:
                        await client.ping()
                        break
                    except RedisError:
                        await trio.sleep(0.02)
        if self.cluster_dir is not None:
            async with coredis.Redis(host="127.0.0.1", port=self.port) as raw:
                await raw.cluster_addslotsrange([self.slots])

    async def cluster_ok(self) -> None:
        """Until the node says the cluster serves every slot."""
        async with coredis.Redis(host="127.0.0.1", port=self.port) as raw:
            with trio.fail_after(START_TIMEOUT_S):
                while True:  # the node's own view: no event to wait on
                    if (await raw.cluster_info()).get("cluster_state") == "ok":
                        break
                    await trio.sleep(0.02)

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)  # a paused one too
            self.process.kill()
            self.process.wait()
            self.process = None


@asynccontextmanager
async def running_redis(
    *, tls: tuple[str, str] | None = None, cluster_dir: str | None = None
) -> AsyncIterator[RedisServer]:
    server = RedisServer(free_port(), tls=tls, cluster_dir=cluster_dir)
    await server.start()
    try:
        if cluster_dir is not None:
            await server.cluster_ok()
        yield server
    finally:
        server.kill()


@asynccontextmanager
async def running_redis_cluster(directory: Path, nodes: int = 3) -> AsyncIterator[RedisServer]:
    """A Redis Cluster of ``nodes`` primaries splitting the slots evenly; the first is
    yielded (a client finds the others through it)."""
    step = 16384 // nodes
    servers = []
    try:
        for i in range(nodes):
            folder = directory / f"node{i}"
            folder.mkdir()
            last = 16383 if i == nodes - 1 else (i + 1) * step - 1
            server = RedisServer(free_port(), cluster_dir=str(folder), slots=(i * step, last))
            servers.append(server)
            await server.start()
        async with coredis.Redis(host="127.0.0.1", port=servers[0].port) as raw:
            for other in servers[1:]:
                await raw.cluster_meet("127.0.0.1", other.port)
        for server in servers:
            await server.cluster_ok()
        yield servers[0]
    finally:
        for server in servers:
            server.kill()


def pause(server: RedisServer) -> None:
    """A Redis that accepts and never answers (SIGSTOP): the slow case."""
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)


def resume(server: RedisServer) -> None:
    assert server.process is not None
    server.process.send_signal(signal.SIGCONT)
