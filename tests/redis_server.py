"""A real redis-server on a free port, for tests. A missing binary fails the test: never skips."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import coredis
import pytest
import trio
from bench.processes import ephemeral_low, free_port

from trio_gateway.redis.client import RedisError, open_redis

REDIS_BINARY = "redis-server"
START_TIMEOUT_S = 10.0
# A port chosen free can be taken before redis-server binds it (another test process, under
# pytest-xdist, draws from the same range): a server that dies at start is tried on a new one.
START_ATTEMPTS = 5
PING_TIMEOUT_S = 1.0
# A cluster node also listens on its port + 10000 (the cluster bus).
BUS_OFFSET = 10_000


class DiedAtStart(Exception):
    """redis-server exited before it listened: most likely its port (or bus port) was taken."""


def cluster_port() -> int:
    """A free port whose bus port is free too, both below the kernel's ephemeral range."""
    while True:
        port = free_port()
        if port + BUS_OFFSET >= ephemeral_low():
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port


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
                    self._check_alive()
                    await trio.sleep(0.02)  # another process: nothing to wait on but the clock
                    continue
                await stream.aclose()
                break
        # Raised out here: the client's nursery would wrap it in a group.
        async with open_redis(self.url, ca_file=self.ca_file) as client:
            with trio.fail_after(START_TIMEOUT_S):
                while True:
                    if self.process.poll() is not None:
                        break  # the port answering is somebody else's
                    with trio.move_on_after(PING_TIMEOUT_S):
                        try:
                            await client.ping()
                            break
                        except RedisError:
                            pass
                    await trio.sleep(0.02)
        self._check_alive()
        if self.cluster_dir is not None:
            async with coredis.Redis(host="127.0.0.1", port=self.port) as raw:
                await raw.cluster_addslotsrange([self.slots])

    def _check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            self.process = None
            raise DiedAtStart(f"redis-server on port {self.port} exited")

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


async def started(make: Callable[[int], RedisServer]) -> RedisServer:
    """The server ``make(attempt)`` builds, started; one that dies at start (its port taken
    meanwhile) is given up for the next attempt's, START_ATTEMPTS in all."""
    for attempt in range(START_ATTEMPTS - 1):
        server = make(attempt)
        try:
            await server.start()
            return server
        except DiedAtStart:
            continue
    server = make(START_ATTEMPTS - 1)
    await server.start()
    return server


@asynccontextmanager
async def running_redis(
    *, tls: tuple[str, str] | None = None, cluster_dir: str | None = None
) -> AsyncIterator[RedisServer]:
    def make(attempt: int) -> RedisServer:
        if cluster_dir is None:
            return RedisServer(free_port(), tls=tls)
        if attempt > 0:  # its node file names the port it could not have
            (Path(cluster_dir) / "nodes.conf").unlink(missing_ok=True)
        return RedisServer(cluster_port(), tls=tls, cluster_dir=cluster_dir)

    server = await started(make)
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
            last = 16383 if i == nodes - 1 else (i + 1) * step - 1

            def node(attempt: int, i: int = i, last: int = last) -> RedisServer:
                folder = directory / f"node{i}-{attempt}"  # a fresh node file each try
                folder.mkdir()
                return RedisServer(cluster_port(), cluster_dir=str(folder), slots=(i * step, last))

            server = await started(node)
            servers.append(server)
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
