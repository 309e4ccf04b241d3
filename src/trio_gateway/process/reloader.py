"""Applying a new config to a running gateway (SIGHUP, ``trio-gateway reload``).

All of the new file is read and checked before anything changes: a file with a problem, or
one that changes what only a restart can (``reload.fixed_changes``), is refused whole, each
problem logged with its path, and counted (``gateway_config_reloads_total{result="rejected"}``).
Otherwise the new providers are built (no I/O yet), then, with no checkpoint in between, the
router, the app and the keys switch to the new config: requests admitted from then on see the
new aliases, weights and limits, requests already planned finish on the providers they hold.
New providers' probes start; retired ones stop probing at once and close their connections
once their last stream has ended (``live.retire``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

from trio_gateway.capacity.health import ProviderHealth
from trio_gateway.config.reload_plan import fixed_changes, plan_reload
from trio_gateway.config.schema import ConfigError, GatewayConfig
from trio_gateway.core.keys import KeyRing, KeysFileError, load_keys
from trio_gateway.dispatch.live import Gates, Running, open_provider, retire, serve_services
from trio_gateway.dispatch.router import Provider, Router
from trio_gateway.fronts.app import GatewayApp

log = logging.getLogger("trio_gateway")

LoadConfig = Callable[[], GatewayConfig]


@attrs.frozen
class ReloadOutcome:
    """What a reload came to: applied (and what changed), or refused (and why)."""

    applied: bool
    problems: tuple[str, ...] = ()
    summary: str = ""


OnOutcome = Callable[[ReloadOutcome], Awaitable[None]]


class Reloader:
    """The gateway's current config and running providers, and the one way to change them."""

    def __init__(
        self,
        config: GatewayConfig,
        running: dict[str, Running],
        router: Router,
        app: GatewayApp,
        gates: Gates,
        nursery: trio.Nursery,
        load: LoadConfig | None,
    ) -> None:
        self.config = config
        self.running = running
        self._router = router
        self._app = app
        self._gates = gates
        self._nursery = nursery
        self._load = load
        # One reload at a time: a second SIGHUP during one waits for it, then reads the file.
        self._lock = trio.Lock()
        # Told each outcome as soon as it is decided, before new providers' probes start
        # (`trio-gateway reload` waits on it: reload_status.py).
        self.on_outcome: OnOutcome | None = None

    async def reload(self) -> bool:
        """Read the config again and apply it; False (and nothing changed) when it was refused."""
        async with self._lock:
            applied = await self._reload()
        self._router.metrics.config_reloads.labels("applied" if applied else "rejected").inc()
        return applied

    async def _refused(self, source: str, problems: list[str]) -> bool:
        for problem in problems:
            log.error("reload: %s: %s", source, problem)
        log.error("reload: %s: %d problem(s); nothing changed", source, len(problems))
        await self._said(ReloadOutcome(applied=False, problems=tuple(problems)))
        return False

    async def _said(self, outcome: ReloadOutcome) -> None:
        if self.on_outcome is not None:
            await self.on_outcome(outcome)

    async def _reload(self) -> bool:
        source = self.config.source
        if self._load is None:
            problem = "this gateway's config was not read from a file; nothing reloaded"
            log.error("reload: %s", problem)
            await self._said(ReloadOutcome(applied=False, problems=(problem,)))
            return False
        try:
            new = self._load()
        except ConfigError as exc:
            return await self._refused(exc.source, exc.problems)
        problems = fixed_changes(self.config, new)
        if problems:
            return await self._refused(source, problems)
        ring: KeyRing | None = None
        if new.auth.keys_file is not None:
            try:
                ring = load_keys(new.auth.keys_file, known_aliases=new.aliases.keys())
            except KeysFileError as exc:
                return await self._refused(source, [f"auth.keys_file: {p}" for p in exc.problems])
        plan = plan_reload({n: r.provider.config for n, r in self.running.items()}, new.providers())
        built: dict[str, Running] = {}
        try:
            for name in plan.added + plan.replaced:
                built[name] = await open_provider(new.providers()[name], new.api_keys, self._gates)
        except Exception as exc:  # a credential file gone since the check, say
            for one in built.values():
                await one.aclose()
            return await self._refused(source, [f"providers: cannot set up: {exc}"])
        # The switch: no checkpoint from here to the end of the block.
        retired = [self.running[n] for n in plan.replaced + plan.removed]
        for name in plan.resized:
            self.running[name].resize(new.providers()[name], self._gates)
        running = {name: built.get(name) or self.running[name] for name in new.providers()}
        self._router.apply(new.aliases, _providers(running), _healths(running), new.filters)
        self._app.config = new
        if ring is not None and self._app.keys is not None and new.auth.keys_file is not None:
            self._app.keys.replace(new.auth.keys_file, ring, known_aliases=new.aliases.keys())
        # In place: the server closes whatever this holds at the end.
        self.running.clear()
        self.running.update(running)
        self.config = new
        # End of the switch.
        log.info("reload: %s applied: %s", source, plan.summary())
        await self._said(ReloadOutcome(applied=True, summary=plan.summary()))
        for one in built.values():
            one.services = await self._nursery.start(serve_services, one)
        for old in retired:
            # Its probes stop now; its connections once its last stream has ended.
            if old.services is not None:
                old.services.cancel(reason="provider retired by a reload")
            self._nursery.start_soon(retire, old)
        return True


def _providers(running: dict[str, Running]) -> dict[str, Provider]:
    return {name: r.provider for name, r in running.items()}


def _healths(running: dict[str, Running]) -> dict[str, ProviderHealth]:
    return {name: r.health for name, r in running.items() if r.health is not None}
