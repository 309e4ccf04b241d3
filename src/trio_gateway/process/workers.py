"""``[server] workers = N``: N gateway processes on one listening socket, and their supervisor.

One gateway process relays on one core. With ``workers = N`` the ``serve`` process becomes a
supervisor: it binds the listening socket (so every worker accepts from the same queue of
connections, and the kernel hands each to whichever worker accepts first), runs the
embedded simulators once, and starts N workers, each a whole gateway (``trio-gateway serve
--worker-fd FD``) that inherits the socket. It forwards signals: SIGTERM and SIGINT make every
worker drain (a second one stops them at once), SIGHUP makes every worker reload. A worker
that exits while the gateway is not stopping is started again, after a pause that grows
while it keeps failing.

The workers share their limits through the supervisor's host broker (host_broker.py), each
over a socketpair made before it starts (``--broker-fd``): every provider's ``max_inflight``,
reservation and queue order without Redis leases, budgets and rate limits without Redis. With
``[redis]`` (``leases = true``) every provider's slots are leases there (gate.py), shared with
the other hosts too. Metrics are per worker: a scrape of ``/metrics`` reaches one of them.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence

import trio

from trio_gateway.accounting.admission import open_limits
from trio_gateway.accounting.key_store import KeyStore
from trio_gateway.accounting.ledger import LEDGER_MEMORY, ledger_path
from trio_gateway.accounting.spend import LedgerSpend, open_spend
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.ops.sd_notify import notify
from trio_gateway.process.host_broker import HostBroker
from trio_gateway.process.serve import (
    hypercorn_config,
    listen_origin,
    listening_on,
    listening_sockets,
    start_simulators,
)

log = logging.getLogger("trio_gateway")

# A worker that exits this soon after it started is failing, not finishing: wait before the
# next start, doubling up to the maximum.
RESTART_PAUSE_S = 0.5
MAX_RESTART_PAUSE_S = 30.0
STARTED_OK_AFTER_S = 10.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def worker_command(
    argv: Sequence[str], fd: int, lifeline: int, broker: int, workers: int
) -> list[str]:
    """A worker's command line: the supervisor's own ``serve`` arguments, plus the listening
    socket, the lifeline pipe and the host broker's socket it inherits, and how many workers
    there are (each takes its share of what is split: live.Gates.dials)."""
    inherited = ["--worker-fd", str(fd), "--lifeline-fd", str(lifeline), "--broker-fd", str(broker)]
    return [sys.executable, "-m", "trio_gateway", *argv, *inherited, "--worker-count", str(workers)]


def second_signal_hint(signum: int) -> str:
    """What stops a drain at once, said the way whoever sent ``signum`` would do it again."""
    if signum == signal.SIGINT:
        return "a second Ctrl-C"
    return f"a second {signal.Signals(signum).name}"


def restart_pause(previous_s: float, ran_s: float) -> float:
    """How long to wait before starting again a worker that ran ``ran_s`` (pure)."""
    if ran_s >= STARTED_OK_AFTER_S:
        return RESTART_PAUSE_S
    return min(MAX_RESTART_PAUSE_S, max(RESTART_PAUSE_S, 2 * previous_s))


class Supervisor:
    def __init__(self, config: GatewayConfig, serve_argv: Sequence[str], workers: int) -> None:
        self.config = config
        self.workers = workers
        self._argv = list(serve_argv)
        self._processes: dict[int, trio.Process] = {}
        self._lifeline = -1
        self.stopping = False
        # Budgets and rate limits in this process for every worker, unless Redis has them.
        self.limits = open_limits(config, None) if config.redis is None else None
        limits = self.limits
        self.broker = HostBroker(
            limits.store if limits is not None else None,
            seed=limits.seed if limits is not None else None,
        )

    async def run(self) -> None:
        spend = await self._rebuild_spend()
        try:
            await self._serve()
        finally:
            if spend is not None:
                spend.close()

    async def _rebuild_spend(self) -> LedgerSpend | None:
        """Without Redis, the workers' budgets are this process's: each key's spend in its
        period is rebuilt here from the usage ledger they all write, so a restart keeps it."""
        config, limits = self.config, self.limits
        if limits is None or config.auth.keys_file is None:
            return None  # Redis keeps spend, or no keys and so no budgets
        keys = KeyStore(config.auth.keys_file, known_aliases=config.aliases.keys()).ring()
        ledger = ledger_path(config)
        why = f"[usage] sink = {config.usage.sink!r}"
        if ledger == LEDGER_MEMORY:
            ledger, why = None, "the usage ledger is in memory"
        elif ledger is None and config.usage.sink == "sqlite":
            why = '[usage] ledger = "none"'
        return await open_spend(limits, ledger, list(keys), why_none=why, now=time.time())

    async def _serve(self) -> None:
        config = self.config
        async with trio.open_nursery() as nursery:
            await start_simulators(config, nursery)
            hc = hypercorn_config(
                config.server.listen,
                graceful_timeout_s=config.server.drain_timeout_s,
                websocket_max_message_bytes=max(
                    config.websocket.max_message_bytes,
                    config.websocket.responses.max_message_bytes,
                ),
            )
            with listening_on(config.server.listen, listen_origin(config)):
                sockets = listening_sockets(
                    hc, stall_timeout_s=config.server.client_stall_timeout_s
                )
            (listener,) = sockets.insecure_sockets
            # Workers see EOF on this pipe when the supervisor is gone, even by kill -9, and
            # drain instead of serving on as orphans.
            self._lifeline, lifeline_write = os.pipe()
            workers = self.workers
            auto = " (one per usable core)" if config.server.workers == "auto" else ""
            log.info("supervisor: %d workers%s on %s", workers, auto, _address(listener))
            with trio.open_signal_receiver(*FORWARDED) as signals:
                async with trio.open_nursery() as workers_nursery:
                    for index in range(workers):
                        workers_nursery.start_soon(self._keep_running, index, listener)
                    nursery.start_soon(self._forward, signals)
                    # The socket listens already: connections wait in its backlog until a
                    # worker accepts them (a second or so).
                    notify(f"READY=1\nSTATUS={workers} workers on {_address(listener)}")
                # Every worker has exited: stop the simulators and the signal forwarding.
                os.close(lifeline_write)
                nursery.cancel_scope.cancel()

    async def _keep_running(self, index: int, listener: socket.socket) -> None:
        pause = 0.0
        while not self.stopping:
            started = trio.current_time()
            fd = listener.fileno()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                process = await trio.lowlevel.open_process(
                    worker_command(self._argv, fd, self._lifeline, theirs.fileno(), self.workers),
                    pass_fds=(fd, self._lifeline, theirs.fileno()),
                    # systemd hears from the supervisor only (NotifyAccess=main).
                    env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"},
                    # Its own process group: a Ctrl-C reaches the supervisor alone, which
                    # passes it on once (twice would stop the workers without a drain).
                    start_new_session=True,
                )
            except BaseException:
                ours.close()
                raise
            finally:
                # The worker's end is the worker's alone: when it exits, the end closes.
                theirs.close()
            self._processes[index] = process
            log.info("supervisor: worker %d started (pid %d)", index, process.pid)
            async with trio.open_nursery() as served:
                await served.start(self.broker.serve_worker, ours)
                try:
                    code = await process.wait()
                finally:
                    # Cancelled (the supervisor itself is stopping at once): take the worker
                    # along.
                    if process.returncode is None:
                        process.kill()
                    del self._processes[index]
                    # Reaped: what it held goes back now, whatever is left to read of it.
                    served.cancel_scope.cancel()
            if self.stopping:
                log.info("supervisor: worker %d (pid %d) exited: %d", index, process.pid, code)
                return
            pause = restart_pause(pause, trio.current_time() - started)
            log.error(
                "supervisor: worker %d (pid %d) exited with %d; starting it again in %g s",
                index,
                process.pid,
                code,
                pause,
            )
            await trio.sleep(pause)

    async def _forward(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            hint = ""
            if signum != signal.SIGHUP:
                if not self.stopping:
                    hint = f", which drain ({second_signal_hint(signum)} stops them at once)"
                self.stopping = True
                notify("STOPPING=1\nSTATUS=draining")
            log.info(
                "supervisor: %s: passing it on to %d workers%s", name, len(self._processes), hint
            )
            for process in list(self._processes.values()):
                if process.returncode is None:
                    process.send_signal(signum)


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


async def serve_workers(config: GatewayConfig, serve_argv: Sequence[str], workers: int) -> None:
    """Run the supervisor of ``workers`` workers until every one has exited after a stop
    signal."""
    await Supervisor(config, serve_argv, workers).run()
